// The step benchmark's analytic FLOP count against a hand count on a tiny configuration, and its
// attention term against the visible pairs of the real block attention mask.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "bench/step_flops.h"
#include "common/dspine_tiny.h"
#include "model/block_mask.h"

namespace dspine::bench {
namespace {

std::map<std::string, FlopPart> by_name(const std::vector<FlopPart>& parts) {
  std::map<std::string, FlopPart> named;
  for (const auto& part : parts) named[part.name] = part;
  return named;
}

// H 16, I 32, 4 heads / 2 kv heads of 4, 3 layers, V 32, block 4, K 3, rank 8, message 4,
// top-k 3; one row of S = 8 with N = 2 anchors at mean position 3: 8 block tokens, P = 6
// proposal rows reading 5 distinct teacher positions. Every product [m, k] x [k, n] is 2·m·k·n.
TEST(StepFlops, MatchesAHandCountOnTheTinyConfig) {
  const auto model = testing::tiny_model_config();
  const auto parts = by_name(dspine_step_flops(model, {1, 8, 2, 3.0, 5.0}));
  ASSERT_EQ(parts.size(), 8u);
  // fc: 8 context tokens × 48 → 16; frozen target states, weight gradient only.
  EXPECT_DOUBLE_EQ(parts.at("context").forward, 2.0 * 8 * 48 * 16);
  EXPECT_DOUBLE_EQ(parts.at("context").backward, 2.0 * 8 * 48 * 16);
  // q, o: 8 × 16 × 16; k, v: (8 context + 8 block) × 16 × 8; 3 layers; backward 2×.
  const double projections = 3 * (2 * (2.0 * 8 * 16 * 16) + 2 * (2.0 * 16 * 16 * 8));
  EXPECT_DOUBLE_EQ(parts.at("projections").forward, projections);
  EXPECT_DOUBLE_EQ(parts.at("projections").backward, 2 * projections);
  // gate, up, down: 8 × 16 × 32 each.
  EXPECT_DOUBLE_EQ(parts.at("mlp").forward, 3 * 3 * (2.0 * 8 * 16 * 32));
  EXPECT_DOUBLE_EQ(parts.at("mlp").backward, 2 * 3 * 3 * (2.0 * 8 * 16 * 32));
  // Pairs: 2 blocks × (4 queries × 3 context keys + 10 causal in-block pairs) = 44; scores and
  // values 2·4 FLOPs each per pair and head, 4 heads.
  EXPECT_DOUBLE_EQ(parts.at("attention").forward, 3 * 44 * 4 * (2.0 * 4 + 2.0 * 4));
  EXPECT_DOUBLE_EQ(parts.at("attention").backward, 2 * 3 * 44 * 4 * (2.0 * 4 + 2.0 * 4));
  // Readout 8 × 16 × 8; on 6 proposals three 8 → 4 products and the 4 → 16 write.
  const double write = 3 * (2.0 * 6 * 8 * 4) + 2.0 * 6 * 4 * 16;
  const double injection = 3 * (2.0 * 8 * 16 * 8 + write);
  EXPECT_DOUBLE_EQ(parts.at("injection").forward, injection);
  EXPECT_DOUBLE_EQ(parts.at("injection").backward, 2 * injection);
  // Refinement head on 6 rows, plus 6 × 3 candidate scores of width 16 (frozen rows: 1×).
  const double head = 2.0 * 6 * 16 * 8 + write, scores = 2.0 * 6 * 3 * 16;
  EXPECT_DOUBLE_EQ(parts.at("refinement").forward, head + scores);
  EXPECT_DOUBLE_EQ(parts.at("refinement").backward, 2 * head + scores);
  // Vocabulary: the teacher 5 × 16 × 32 (once per position), without gradient; the draft
  // 6 × 16 × 32, with dX only.
  EXPECT_DOUBLE_EQ(parts.at("teacher_logits").forward, 2.0 * 5 * 16 * 32);
  EXPECT_DOUBLE_EQ(parts.at("teacher_logits").backward, 0.0);
  EXPECT_DOUBLE_EQ(parts.at("draft_logits").forward, 2.0 * 6 * 16 * 32);
  EXPECT_DOUBLE_EQ(parts.at("draft_logits").backward, 2.0 * 6 * 16 * 32);

  double sum = 0.0;
  for (const auto& [name, part] : parts) sum += part.forward + part.backward;
  EXPECT_DOUBLE_EQ(total_flops(dspine_step_flops(model, {1, 8, 2, 3.0, 5.0})), sum);
}

TEST(StepFlops, AttentionCountsTheVisiblePairsOfTheBlockMask) {
  const auto model = testing::tiny_model_config();
  const int64_t seq = 24;
  auto anchors = torch::tensor({{1, 6, 13}, {2, 9, 20}}, torch::kInt64);
  auto keep = torch::ones({2, 3}, torch::kBool);
  const auto visible = static_cast<double>(
      model::block_attention_mask(anchors, keep, seq, model.block_size).sum().item<int64_t>());
  const double mean_anchor = anchors.to(torch::kDouble).mean().item<double>();
  const auto parts = by_name(dspine_step_flops(model, {2, seq, 3, mean_anchor, 20.0}));
  const double per_pair = 4.0 * model.head_dim * model.num_attention_heads;  // QKᵀ and PV
  EXPECT_DOUBLE_EQ(parts.at("attention").forward,
                   static_cast<double>(model.num_hidden_layers) * per_pair * visible);
}

TEST(StepFlops, ScalesWithRows) {
  const auto model = testing::tiny_model_config();
  const double one = total_flops(dspine_step_flops(model, {1, 8, 2, 3.0, 5.0}));
  EXPECT_DOUBLE_EQ(total_flops(dspine_step_flops(model, {3, 8, 2, 3.0, 5.0})), 3 * one);
}

// The expected distinct teacher positions against hand counts: one anchor of five reading two
// positions each (the last one only itself: 2, 2, 2, 2, 1 → 1.8); every anchor drawn (each valid
// position and the one after it, within the row); and the recipe's row.
TEST(StepFlops, ExpectedTeacherPositionsMatchHandCounts) {
  EXPECT_NEAR(expected_teacher_positions(std::vector<bool>(5, true), 1, 2), 1.8, 1e-12);
  const std::vector<bool> gaps{false, true, true, false, false, true, false};
  EXPECT_NEAR(expected_teacher_positions(gaps, 3, 2), 5.0, 1e-12);  // 1, 2, 3, 5, 6
  // Two of the three valid anchors: position 2 is read by anchor 1 or 2, one of which is always
  // drawn; positions 1, 3, 5 and 6 each by one anchor, drawn with probability 2/3.
  EXPECT_NEAR(expected_teacher_positions(gaps, 2, 2), 1.0 + 4 * 2.0 / 3, 1e-12);
  std::vector<bool> recipe(3071, true);
  for (int a = 0; a < 8; ++a) recipe[a] = false;
  EXPECT_NEAR(expected_teacher_positions(recipe, 512, 15), 2863.6, 0.1);
}

// configs/qwen3-8b-dspine.yaml on random data (prompt of 8 unsupervised tokens: valid anchors
// 8..3070, mean 1539; 2,863.6 distinct teacher positions per row): about 154.5 TFLOP per
// micro-batch, of which the two vocabulary projections are 45.4 (teacher 7.1 forward; draft 19.1
// forward + 19.1 dX).
TEST(StepFlops, RecipeSize) {
  dspine::model::DSpineModelConfig model;
  model.hidden_size = 4096;
  model.intermediate_size = 12288;
  model.num_hidden_layers = 5;
  model.num_attention_heads = 32;
  model.num_key_value_heads = 8;
  model.head_dim = 128;
  model.vocab_size = 151936;
  model.block_size = 16;
  model.target_layer_ids = {1, 9, 17, 25, 33};
  model.dspine.transfer_rank = 1024;
  model.dspine.message_size = 512;
  model.dspine.top_k = 16;
  const auto parts = dspine_step_flops(model, {2, 3072, 512, 1539.0, 2863.6});
  EXPECT_NEAR(total_flops(parts) / 1e12, 154.52, 0.01);
  const auto named = by_name(parts);
  EXPECT_NEAR(named.at("draft_logits").forward / 1e12, 19.118, 0.001);
  EXPECT_NEAR(named.at("teacher_logits").forward / 1e12, 7.128, 0.001);
}

}  // namespace
}  // namespace dspine::bench
