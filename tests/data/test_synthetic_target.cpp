#include <map>
#include <set>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/error.h"
#include "data/batch.h"
#include "data/synthetic_target.h"

namespace dspine::data {
namespace {

core::ModelConfig small_model() {
  core::ModelConfig model;
  model.hidden_size = 32;
  model.vocab_size = 64;
  model.target_layer_ids = {0, 1, 3};
  return model;
}

core::SyntheticTargetConfig small_target() {
  core::SyntheticTargetConfig target;
  target.num_layers = 4;
  target.num_attention_heads = 4;
  target.num_key_value_heads = 2;
  target.head_dim = 8;
  target.intermediate_size = 64;
  target.prompt_length = 3;
  return target;
}

void expect_batches_equal(const DraftBatch& a, const DraftBatch& b) {
  EXPECT_TRUE(torch::equal(a.input_ids, b.input_ids));
  EXPECT_TRUE(torch::equal(a.loss_mask, b.loss_mask));
  EXPECT_TRUE(torch::equal(a.hidden_states, b.hidden_states));
  EXPECT_TRUE(torch::equal(a.target_last_hidden_states, b.target_last_hidden_states));
}

TEST(SyntheticTarget, SampleIsAPureFunctionOfSeedAndIndex) {
  const SyntheticTarget a(small_model(), small_target());
  const SyntheticTarget b(small_model(), small_target());
  expect_batches_equal(a.sample(7, 16), b.sample(7, 16));
  EXPECT_TRUE(torch::equal(a.lm_head(), b.lm_head()));
  EXPECT_FALSE(torch::equal(a.sample(7, 16).input_ids, a.sample(8, 16).input_ids));

  auto other_seed = small_target();
  other_seed.seed += 1;
  const SyntheticTarget c(small_model(), other_seed);
  EXPECT_FALSE(torch::equal(a.embed_tokens(), c.embed_tokens()));
  EXPECT_FALSE(torch::equal(a.sample(7, 16).input_ids, c.sample(7, 16).input_ids));
}

TEST(SyntheticTarget, SamplesDoNotDependOnTheOrderTheyAreAskedIn) {
  // Samples are decoded in groups; whichever group was decoded last must not matter.
  const SyntheticTarget target(small_model(), small_target());
  const DraftBatch late = target.sample(SyntheticTarget::kSampleGroup + 1, 12);
  const DraftBatch early = target.sample(2, 12);
  const SyntheticTarget fresh(small_model(), small_target());
  expect_batches_equal(early, fresh.sample(2, 12));
  expect_batches_equal(late, fresh.sample(SyntheticTarget::kSampleGroup + 1, 12));
  expect_batches_equal(target.sample(2, 12), early);
  EXPECT_FALSE(torch::equal(early.input_ids, target.sample(3, 12).input_ids));
}

TEST(SyntheticTarget, ConstructionLeavesTheGlobalGeneratorAlone) {
  torch::manual_seed(5);
  const auto expected = torch::rand({4});
  torch::manual_seed(5);
  const SyntheticTarget target(small_model(), small_target());
  target.sample(0, 8);
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected));
}

TEST(SyntheticTarget, SamplesDoNotDependOnTheThreadCount) {
  const SyntheticTarget target(small_model(), small_target());
  const int previous = torch::get_num_threads();
  torch::set_num_threads(1);
  const DraftBatch serial = target.sample(5, 16);
  torch::set_num_threads(2);
  const DraftBatch threaded = target.sample(5, 16);
  torch::set_num_threads(previous);
  expect_batches_equal(serial, threaded);
}

TEST(SyntheticTarget, SampleHasTheDraftInputShapesAndDtypes) {
  const SyntheticTarget target(small_model(), small_target());
  const DraftBatch s = target.sample(0, 12);
  EXPECT_EQ(s.input_ids.sizes(), torch::IntArrayRef({1, 12}));
  EXPECT_EQ(s.input_ids.scalar_type(), torch::kLong);
  EXPECT_EQ(s.loss_mask.sizes(), torch::IntArrayRef({1, 12}));
  EXPECT_EQ(s.loss_mask.scalar_type(), torch::kLong);
  EXPECT_EQ(s.hidden_states.sizes(), torch::IntArrayRef({1, 12, 3 * 32}));
  EXPECT_EQ(s.hidden_states.scalar_type(), torch::kFloat);
  EXPECT_EQ(s.target_last_hidden_states.sizes(), torch::IntArrayRef({1, 12, 32}));
  EXPECT_EQ(target.embed_tokens().sizes(), torch::IntArrayRef({64, 32}));
  EXPECT_EQ(target.lm_head().sizes(), torch::IntArrayRef({64, 32}));
  EXPECT_TRUE(torch::isfinite(s.hidden_states).all().item<bool>());
}

TEST(SyntheticTarget, LossMaskIsZeroOverThePromptOnly) {
  const SyntheticTarget target(small_model(), small_target());
  const auto mask = target.sample(2, 10).loss_mask;
  EXPECT_TRUE(torch::equal(mask, torch::tensor({{0, 0, 0, 1, 1, 1, 1, 1, 1, 1}}, torch::kLong)));
  EXPECT_THROW(target.sample(0, 3), Error);  // nothing left to supervise
}

TEST(SyntheticTarget, HiddenStateSlicesAreTheCapturedLayerOutputs) {
  const SyntheticTarget target(small_model(), small_target());  // layers {0, 1, 3} of 4
  const DraftBatch s = target.sample(1, 12);
  const int64_t h = 32;
  // The last slice is the output of the last decoder layer, so the final RMSNorm (unit weight)
  // of it is target_last_hidden_states.
  const auto last_layer = s.hidden_states.narrow(-1, 2 * h, h);
  EXPECT_TRUE(torch::allclose(torch::rms_norm(last_layer, {h}, {}, 1e-6),
                              s.target_last_hidden_states, 1e-5, 1e-5));

  // Each slice is the layer named at its position of target_layer_ids.
  auto reordered = small_model();
  reordered.target_layer_ids = {3, 1};
  const DraftBatch r = SyntheticTarget(reordered, small_target()).run(s.input_ids);
  EXPECT_TRUE(torch::equal(r.hidden_states.narrow(-1, 0, h), last_layer));
  EXPECT_TRUE(torch::equal(r.hidden_states.narrow(-1, h, h), s.hidden_states.narrow(-1, h, h)));
  EXPECT_FALSE(torch::allclose(s.hidden_states.narrow(-1, 0, h), s.hidden_states.narrow(-1, h, h)));
}

TEST(SyntheticTarget, AttentionIsCausal) {
  const SyntheticTarget target(small_model(), small_target());
  const auto ids = target.sample(3, 12).input_ids;
  auto changed = ids.clone();
  changed[0][8] = (changed[0][8].item<int64_t>() + 1) % 63;
  const DraftBatch a = target.run(ids), b = target.run(changed);
  EXPECT_TRUE(torch::equal(a.hidden_states.narrow(1, 0, 8), b.hidden_states.narrow(1, 0, 8)));
  EXPECT_FALSE(torch::allclose(a.target_last_hidden_states.narrow(1, 9, 3),
                               b.target_last_hidden_states.narrow(1, 9, 3)));
}

TEST(SyntheticTarget, LogitsAreTheLastHiddenStateThroughTheHead) {
  const SyntheticTarget target(small_model(), small_target());
  const DraftBatch s = target.sample(4, 12);
  const auto logits = target.logits(s.input_ids);
  EXPECT_EQ(logits.sizes(), torch::IntArrayRef({1, 12, 64}));
  EXPECT_TRUE(torch::allclose(torch::matmul(s.target_last_hidden_states, target.lm_head().t()),
                              logits, 1e-5, 1e-5));

  // logit_scale is folded into the exported head: the draft's teacher is the sampling
  // distribution.
  auto doubled = small_target();
  doubled.logit_scale = 2.0;
  const SyntheticTarget scaled(small_model(), doubled);
  EXPECT_TRUE(torch::allclose(scaled.lm_head(), 2.0 * target.lm_head()));
  EXPECT_TRUE(torch::allclose(scaled.logits(s.input_ids), 2.0 * logits, 1e-5, 1e-4));
}

TEST(SyntheticTarget, SamplesFollowTheTargetsOwnDistribution) {
  const SyntheticTarget target(small_model(), small_target());
  const auto ids = torch::cat({target.sample(0, 32).input_ids, target.sample(1, 32).input_ids});
  const auto log_probs = torch::log_softmax(target.logits(ids), -1);
  // log p(token t | prefix) under the target, for every sampled token after the first.
  const auto sampled = log_probs.narrow(1, 0, 31).gather(-1, ids.narrow(1, 1, 31).unsqueeze(-1));
  // Uniform sampling would average -ln 64 = -4.16; the target puts most mass on few tokens.
  EXPECT_GT(sampled.mean().item<double>(), -2.0);
  const int64_t mask_id = 63;  // model.mask_token_id = -1: the last vocabulary id
  EXPECT_FALSE(ids.eq(mask_id).any().item<bool>());
}

TEST(SyntheticTarget, DefaultConfigIsPeakedButContextDependent) {
  const core::ModelConfig model;                // the defaults training runs with
  const core::SyntheticTargetConfig target_config;
  const SyntheticTarget target(model, target_config);
  std::vector<torch::Tensor> ids;
  for (int64_t i = 0; i < 8; ++i) ids.push_back(target.sample(i, 64).input_ids);
  const auto probs = torch::softmax(target.logits(torch::cat(ids)), -1);
  const auto top = std::get<0>(probs.max(-1));
  const auto entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1);
  EXPECT_GE(top.mean().item<double>(), 0.5);
  EXPECT_LE(top.mean().item<double>(), 0.9);   // still worth sampling, not deterministic
  EXPECT_GT(entropy.std().item<double>(), 0.3);  // peakedness varies with the context

  // The top token depends on more than the current token: the same current token is followed
  // by different argmax tokens in different contexts.
  const auto flat_ids = torch::cat(ids).flatten();
  const auto flat_top = std::get<1>(probs.max(-1)).flatten();
  std::map<int64_t, std::set<int64_t>> next_by_token;
  for (int64_t i = 0; i < flat_ids.size(0); ++i) {
    next_by_token[flat_ids[i].item<int64_t>()].insert(flat_top[i].item<int64_t>());
  }
  int64_t varying = 0;
  for (const auto& [token, tops] : next_by_token) varying += tops.size() > 1;
  EXPECT_GT(varying, static_cast<int64_t>(next_by_token.size()) / 4);
  EXPECT_GT(std::set<int64_t>(flat_top.data_ptr<int64_t>(),
                              flat_top.data_ptr<int64_t>() + flat_top.numel()).size(), 32u);
}

TEST(SyntheticTarget, RejectsLayerIdsBeyondTheTarget) {
  auto model = small_model();
  model.target_layer_ids = {0, 4};
  try {
    SyntheticTarget target(model, small_target());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target_layer_ids"), std::string::npos) << e.what();
  }
}

TEST(DraftBatch, SliceAndConcatRowsInvertEachOther) {
  const SyntheticTarget target(small_model(), small_target());
  const DraftBatch all = concat_rows({target.sample(0, 8), target.sample(1, 8), target.sample(2, 8)});
  EXPECT_EQ(all.rows(), 3);
  expect_batches_equal(all.slice_rows(1, 2), target.sample(1, 8));
  expect_batches_equal(concat_rows({all.slice_rows(0, 1), all.slice_rows(1, 3)}), all);
  EXPECT_THROW(all.slice_rows(2, 4), Error);
  EXPECT_EQ(all.to(torch::kCPU).hidden_states.device(), torch::Device(torch::kCPU));
}

}  // namespace
}  // namespace dspine::data
