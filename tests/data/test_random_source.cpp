#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/expect_error.h"
#include "data/batch_source.h"
#include "data/random_source.h"

namespace dspine::data {
namespace {

using dspine::testing::expect_error_mentioning;

// V 40, H 16, K 3, S 12, prompt 3; a mask token inside the vocabulary, not the last id, so that
// the shift over it is exercised.
core::Config small_config() {
  core::Config config;
  config.data.source = dspine::core::DataSource::kRandom;
  config.model.hidden_size = 16;
  config.model.vocab_size = 40;
  config.model.mask_token_id = 7;
  config.model.target_layer_ids = {1, 9, 17};
  config.data.seq_len = 12;
  config.data.synthetic.prompt_length = 3;
  config.data.synthetic.seed = 5;
  return config;
}

void expect_batches_equal(const DraftBatch& a, const DraftBatch& b) {
  EXPECT_TRUE(torch::equal(a.input_ids, b.input_ids));
  EXPECT_TRUE(torch::equal(a.loss_mask, b.loss_mask));
  EXPECT_TRUE(torch::equal(a.hidden_states, b.hidden_states));
  EXPECT_TRUE(torch::equal(a.target_last_hidden_states, b.target_last_hidden_states));
}

TEST(RandomSource, ShapesDtypesAndValueRanges) {
  RandomSource source(small_config().data, small_config().model, torch::kCPU);
  const DraftBatch batch = source.next(64);
  EXPECT_EQ(batch.input_ids.sizes(), torch::IntArrayRef({64, 12}));
  EXPECT_EQ(batch.loss_mask.sizes(), torch::IntArrayRef({64, 12}));
  EXPECT_EQ(batch.hidden_states.sizes(), torch::IntArrayRef({64, 12, 48}));
  EXPECT_EQ(batch.target_last_hidden_states.sizes(), torch::IntArrayRef({64, 12, 16}));
  EXPECT_EQ(batch.input_ids.scalar_type(), torch::kLong);
  EXPECT_EQ(batch.loss_mask.scalar_type(), torch::kLong);
  EXPECT_EQ(batch.hidden_states.scalar_type(), torch::kFloat);
  EXPECT_EQ(batch.target_last_hidden_states.scalar_type(), torch::kFloat);

  // Every id but the mask token occurs (768 draws over 39 ids), and nothing outside [0, V).
  const auto counts = torch::bincount(batch.input_ids.flatten(), {}, 40);
  EXPECT_EQ(counts[7].item<int64_t>(), 0);
  EXPECT_EQ(counts.gt(0).sum().item<int64_t>(), 39);
  EXPECT_EQ(counts.sum().item<int64_t>(), 64 * 12);

  const auto expected_mask =
      torch::cat({torch::zeros({3}, torch::kLong), torch::ones({9}, torch::kLong)});
  EXPECT_TRUE(torch::equal(batch.loss_mask, expected_mask.expand({64, 12})));

  for (const auto& states : {batch.hidden_states, batch.target_last_hidden_states}) {
    EXPECT_NEAR(states.mean().item<double>(), 0.0, 0.05);
    EXPECT_NEAR(states.std().item<double>(), 1.0, 0.05);
  }
}

TEST(RandomSource, SampleDependsOnlyOnItsCursor) {
  RandomSource together(small_config().data, small_config().model, torch::kCPU);
  const DraftBatch rows = together.next(4);
  EXPECT_EQ(together.cursor(), 4);

  RandomSource single(small_config().data, small_config().model, torch::kCPU);
  single.seek(2);
  expect_batches_equal(single.next(1), rows.slice_rows(2, 3));
  expect_batches_equal(single.next(1), rows.slice_rows(3, 4));
  single.seek(0);
  expect_batches_equal(single.next(2), rows.slice_rows(0, 2));
  EXPECT_EQ(single.cursor(), 2);

  // Rows are distinct samples, and the same cursor gives the same batch again.
  EXPECT_FALSE(torch::equal(rows.hidden_states[0], rows.hidden_states[1]));
  EXPECT_FALSE(torch::equal(rows.input_ids[0], rows.input_ids[1]));
  together.seek(0);
  expect_batches_equal(together.next(4), rows);
  EXPECT_THROW(together.seek(-1), Error);
  EXPECT_THROW(together.next(0), Error);
}

TEST(RandomSource, SeedChangesTheValues) {
  auto config = small_config();
  const DraftBatch a = RandomSource(config.data, config.model, torch::kCPU).next(1);
  config.data.synthetic.seed = 6;
  const DraftBatch b = RandomSource(config.data, config.model, torch::kCPU).next(1);
  EXPECT_FALSE(torch::equal(a.hidden_states, b.hidden_states));
  EXPECT_FALSE(torch::equal(a.input_ids, b.input_ids));
}

TEST(RandomSource, WeightsAreSeededScaledAndDistinct) {
  RandomSource source(small_config().data, small_config().model, torch::kCPU);
  const auto embed = source.embed_tokens(), head = source.lm_head();
  EXPECT_EQ(embed.sizes(), torch::IntArrayRef({40, 16}));
  EXPECT_EQ(head.sizes(), torch::IntArrayRef({40, 16}));
  EXPECT_EQ(embed.scalar_type(), torch::kFloat);
  EXPECT_NEAR(embed.std().item<double>(), RandomSource::kWeightStd, 0.003);
  EXPECT_NEAR(head.std().item<double>(), RandomSource::kWeightStd, 0.003);
  EXPECT_FALSE(torch::equal(embed, head));
  EXPECT_TRUE(torch::equal(embed, source.embed_tokens()));
  EXPECT_TRUE(torch::equal(
      head, RandomSource(small_config().data, small_config().model, torch::kCPU).lm_head()));
}

TEST(RandomSource, MakeBatchSourceBuildsItOnTheGivenDevice) {
  auto source = make_batch_source(small_config(), torch::kCPU);
  RandomSource direct(small_config().data, small_config().model, torch::kCPU);
  source->seek(3);
  direct.seek(3);
  expect_batches_equal(source->next(2), direct.next(2));

  auto config = small_config();
  config.model.vocab_size = 1;
  config.model.mask_token_id = -1;
  expect_error_mentioning([&] { RandomSource(config.data, config.model, torch::kCPU); },
                          {"model.vocab_size", "1"});
}

}  // namespace
}  // namespace dspine::data
