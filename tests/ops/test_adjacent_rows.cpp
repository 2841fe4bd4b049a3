// ops::adjacent_rows: a view (no copy) of two row blocks that follow each other in one buffer,
// with the values of torch::cat and each input's gradient its own rows; a concatenation otherwise.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ops/adjacent_rows.h"

namespace dspine::ops {
namespace {

struct Pair {
  torch::Tensor first, second;
};

// Leaves [3, 4] and [5, 4] viewing one flat buffer, as a sharding unit's parameters do.
Pair adjacent_leaves(const torch::Tensor& flat) {
  return {flat.narrow(0, 0, 12).view({3, 4}).detach().requires_grad_(true),
          flat.narrow(0, 12, 20).view({5, 4}).detach().requires_grad_(true)};
}

TEST(AdjacentRows, ViewOfAdjacentRowsHasCatValuesAndGradients) {
  torch::manual_seed(1);
  const auto flat = torch::randn({40});
  auto pair = adjacent_leaves(flat);
  ASSERT_TRUE(rows_adjacent(pair.first, pair.second));
  const auto packed = adjacent_rows(pair.first, pair.second);
  EXPECT_EQ(packed.data_ptr(), pair.first.data_ptr());  // no copy
  const auto x = torch::randn({6, 4});
  const auto upstream = torch::randn({6, 8});
  (torch::mm(x, packed.t()) * upstream).sum().backward();

  auto a = pair.first.detach().clone().requires_grad_(true);
  auto b = pair.second.detach().clone().requires_grad_(true);
  const auto expected = torch::cat({a, b}, 0);
  EXPECT_TRUE(torch::equal(packed, expected));
  (torch::mm(x, expected.t()) * upstream).sum().backward();
  EXPECT_TRUE(torch::equal(pair.first.grad(), a.grad()));
  EXPECT_TRUE(torch::equal(pair.second.grad(), b.grad()));
}

TEST(AdjacentRows, AnythingElseIsConcatenated) {
  const auto flat = torch::randn({40});
  const auto first = flat.narrow(0, 0, 12).view({3, 4});
  const auto gap = flat.narrow(0, 16, 20).view({5, 4});  // a gap after first
  const auto reversed = flat.narrow(0, 12, 8).view({2, 4});
  const auto other = torch::randn({5, 4});
  EXPECT_FALSE(rows_adjacent(first, gap));
  EXPECT_FALSE(rows_adjacent(first, other));
  EXPECT_FALSE(rows_adjacent(reversed, first));                             // second before first
  EXPECT_FALSE(rows_adjacent(first, flat.narrow(0, 12, 15).view({3, 5})));  // other width
  EXPECT_TRUE(rows_adjacent(first, reversed));
  const auto packed = adjacent_rows(first, other);
  EXPECT_NE(packed.data_ptr(), first.data_ptr());
  EXPECT_TRUE(torch::equal(packed, torch::cat({first, other}, 0)));
}

}  // namespace
}  // namespace dspine::ops
