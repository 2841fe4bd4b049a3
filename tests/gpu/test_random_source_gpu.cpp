// The random source on a CUDA device: batches are made there, and a sample's values depend
// only on its cursor, as on the CPU (tests/data/test_random_source.cpp).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "data/random_source.h"

namespace dspine::data {
namespace {

core::Config small_config() {
  core::Config config;
  config.data.source = dspine::core::DataSource::kRandom;
  config.model.hidden_size = 64;
  config.model.vocab_size = 1000;
  config.model.target_layer_ids = {1, 9, 17, 25, 33};
  config.data.seq_len = 128;
  config.data.synthetic.prompt_length = 8;
  return config;
}

TEST(RandomSourceGpu, BatchesLiveOnTheDeviceAndDependOnlyOnTheCursor) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA, 0);
  RandomSource together(small_config().data, small_config().model, cuda);
  const DraftBatch rows = together.next(4);
  for (const auto& field : {rows.input_ids, rows.loss_mask, rows.hidden_states,
                            rows.target_last_hidden_states}) {
    EXPECT_TRUE(field.device() == cuda);
  }
  // The mask's host copy, which the anchor sampler reads instead of the GPU.
  ASSERT_TRUE(rows.host_loss_mask.defined());
  EXPECT_TRUE(rows.host_loss_mask.is_cpu());
  EXPECT_TRUE(torch::equal(rows.host_loss_mask, rows.loss_mask.cpu()));
  EXPECT_EQ(rows.loss_mask.narrow(1, 0, 8).sum().item<int64_t>(), 0);  // the prompt
  EXPECT_EQ(rows.loss_mask.narrow(1, 8, 120).sum().item<int64_t>(), 4 * 120);
  EXPECT_EQ(rows.hidden_states.sizes(), torch::IntArrayRef({4, 128, 320}));
  EXPECT_EQ(rows.input_ids.eq(999).sum().item<int64_t>(), 0);  // the mask token
  EXPECT_NEAR(rows.hidden_states.std().item<double>(), 1.0, 0.02);
  EXPECT_TRUE(together.lm_head().device() == cuda);
  EXPECT_TRUE(torch::equal(together.lm_head(), together.lm_head()));

  RandomSource single(small_config().data, small_config().model, cuda);
  single.seek(1);
  for (int64_t r = 1; r < 4; ++r) {
    const DraftBatch one = single.next(1);
    EXPECT_TRUE(torch::equal(one.input_ids, rows.input_ids.narrow(0, r, 1)));
    EXPECT_TRUE(torch::equal(one.hidden_states, rows.hidden_states.narrow(0, r, 1)));
    EXPECT_TRUE(torch::equal(one.target_last_hidden_states,
                             rows.target_last_hidden_states.narrow(0, r, 1)));
  }
}

}  // namespace
}  // namespace dspine::data
