// DraftBatch's host copy of the loss mask (docs/model.md, "The host stays ahead"): kept by to()
// when the mask leaves the host, narrowed with the rows, joined when every part has one.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "data/batch.h"

namespace dspine::data {
namespace {

DraftBatch batch_of(int64_t rows, int64_t first_value) {
  auto ids = torch::arange(first_value, first_value + rows * 6, torch::kLong).view({rows, 6});
  return DraftBatch{ids, torch::ones({rows, 6}, torch::kLong), torch::zeros({rows, 6, 4}),
                    torch::zeros({rows, 6, 2})};
}

TEST(DraftBatch, AMaskOnTheHostIsItsOwnHostCopy) {
  const auto batch = batch_of(2, 0);
  const auto moved = batch.to(torch::kCPU);
  EXPECT_FALSE(moved.host_loss_mask.defined());
  EXPECT_TRUE(moved.loss_mask_on_host().is_same(moved.loss_mask));
}

TEST(DraftBatch, TheHostCopyFollowsRowSlicesAndConcatenation) {
  auto a = batch_of(3, 0);
  auto b = batch_of(2, 100);
  // Host copies that differ from the masks, to see which one each call returns.
  a.host_loss_mask = torch::arange(18, torch::kLong).view({3, 6});
  b.host_loss_mask = torch::arange(100, 112, torch::kLong).view({2, 6});
  EXPECT_TRUE(a.loss_mask_on_host().is_same(a.host_loss_mask));
  EXPECT_TRUE(torch::equal(a.to(torch::kCPU).loss_mask_on_host(), a.host_loss_mask));

  const auto rows = a.slice_rows(1, 3);
  EXPECT_TRUE(torch::equal(rows.loss_mask_on_host(), a.host_loss_mask.narrow(0, 1, 2)));

  const auto joined = concat_rows({a, b});
  EXPECT_TRUE(
      torch::equal(joined.loss_mask_on_host(), torch::cat({a.host_loss_mask, b.host_loss_mask})));
  EXPECT_TRUE(torch::equal(joined.input_ids, torch::cat({a.input_ids, b.input_ids})));

  b.host_loss_mask = at::Tensor();  // one part without a copy: the joined batch has none
  const auto partly = concat_rows({a, b});
  EXPECT_FALSE(partly.host_loss_mask.defined());
  EXPECT_TRUE(torch::equal(partly.loss_mask_on_host(), partly.loss_mask));
}

TEST(DraftBatch, QueuedCopiesToTheHostAreTheTensorItself) {
  const auto mask = torch::ones({2, 3}, torch::kLong);
  EXPECT_TRUE(queue_copy_to(mask, torch::kCPU).is_same(mask));
}

}  // namespace
}  // namespace dspine::data
