// A full DSpine window (CE-only prepass + replay, A = 2) with the fused CUDA kernels equals the
// same window with the reference ATen modules (the reference's test T34): loss, every gradient
// (cosine and relative norm error), for fp32 and bf16, at two points of the replacement schedule;
// on the tiny head layout (norm/SwiGLU kernels) and on one the block attention kernels take (bf16).
// With DSPINE_RECIPE_PARITY=1 (scripts/device_check.sh sets it), also one window of the recipe
// (configs/qwen3-8b-dspine.yaml, random inputs) in bf16: the loss within 0.2%, and the gradient
// no farther from the reference than the reference is from itself under a bf16-level input
// perturbation; and with the refinement's candidates (a top-k among near-tied bf16 logits) pinned
// to the same choice on both sides, the gradient cosine at least 0.995.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

#include "common/choice_named.h"
#include "common/dspine_tiny.h"
#include "core/config.h"
#include "data/random_source.h"
#include "dist/communicator.h"
#include "objectives/dspine_objective.h"
#include "objectives/dspine_settings.h"
#include "train/run_config.h"

namespace dspine {
namespace {

// The tiny layout (head_dim 16: attention by the dense reference) or one the block attention
// kernels take (head_dim 64, bs 16 × 2 query heads per kv head).
core::Config step_config(const std::string& fused, bool kernel_heads) {
  core::Config c;
  auto& m = c.model;
  m.architecture = "dspine";
  m.hidden_size = 64;
  m.intermediate_size = 128;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = kernel_heads ? 64 : 16;
  m.num_hidden_layers = 2;
  m.vocab_size = 256;
  m.block_size = kernel_heads ? 16 : 4;
  m.mask_token_id = 255;
  m.target_layer_ids = {0, 1, 2};
  m.fused_kernels = testing::choice_named<core::FusedKernels>(fused);
  c.set_section("model.dspine", model::DSpineConfig{32, 16, 8});
  c.training.accumulation_steps = 2;
  c.objective.name = "dspine";
  return c;
}

data::DraftBatch random_batch(int64_t seed, int64_t seq_len) {
  torch::manual_seed(seed);
  data::DraftBatch b;
  b.input_ids = torch::randint(0, 255, {2, seq_len}, torch::kInt64);
  b.loss_mask = torch::ones({2, seq_len}, torch::kInt64);
  b.loss_mask.slice(1, 0, 4).zero_();
  b.hidden_states = torch::randn({2, seq_len, 3 * 64});
  b.target_last_hidden_states = torch::randn({2, seq_len, 64});
  return b;
}

struct WindowResult {
  double loss = 0;
  std::map<std::string, torch::Tensor> grads;
  torch::Tensor candidates;  // the fused vocabulary's refinement candidates
};

WindowResult gradients_of(objectives::DSpineObjective& objective) {
  WindowResult result;
  for (auto& p : objective.module()->named_parameters()) {
    if (p.value().grad().defined()) result.grads[p.key()] = p.value().grad().to(torch::kDouble).cpu();
  }
  return result;
}

WindowResult run_window(const std::string& fused, bool kernel_heads, torch::Dtype dtype,
                        int64_t step) {
  const torch::Device device(torch::kCUDA);
  torch::manual_seed(5);
  auto head = torch::randn({256, 64}) * 0.3;
  auto embed = torch::randn({256, 64});
  objectives::DSpineSettings settings;
  settings.num_anchors = 8;
  settings.objective_chunk_blocks = 4;
  const auto config = step_config(fused, kernel_heads);
  auto objective = objectives::make_dspine_objective(testing::draft_config(config), settings,
                                                     config.training.accumulation_steps, embed,
                                                     head, device, dtype);
  objective->on_fresh_start("");
  auto comm = dist::make_single_process_communicator();
  objectives::StepContext context;
  context.step = step;
  context.total_steps = 600;
  context.comm = comm.get();
  context.seed = 123;
  const int64_t seq_len = kernel_heads ? 96 : 32;
  std::vector<data::DraftBatch> window{random_batch(1, seq_len).to(device),
                                       random_batch(2, seq_len).to(device)};
  objective->begin_window(window, context);
  double loss = 0;
  for (int64_t i = 0; i < 2; ++i) {
    auto out = objective->micro_step(window[i], i, context);
    out.loss.backward();
    loss += out.loss.item<double>();
  }
  objective->end_window(context);
  auto result = gradients_of(*objective);
  result.loss = loss;
  return result;
}

struct Agreement {
  double cosine, relative;
};

Agreement compare(const WindowResult& fused, const WindowResult& reference) {
  EXPECT_EQ(fused.grads.size(), reference.grads.size());
  std::vector<torch::Tensor> a, b;
  for (const auto& [name, grad] : reference.grads) {
    a.push_back(grad.reshape(-1));
    b.push_back(fused.grads.at(name).reshape(-1));
  }
  auto ga = torch::cat(a), gb = torch::cat(b);
  return {(ga * gb).sum().item<double>() / (ga.norm() * gb.norm()).item<double>(),
          (ga - gb).norm().item<double>() / ga.norm().item<double>()};
}

void expect_window_matches(bool kernel_heads, torch::Dtype dtype) {
  const double tol = dtype == torch::kFloat ? 2e-5 : 2e-2;
  const char* layout = kernel_heads ? "block-kernel heads" : "tiny heads";
  for (int64_t step : {100, 300}) {
    auto reference = run_window("false", kernel_heads, dtype, step);
    auto fused = run_window("true", kernel_heads, dtype, step);
    SCOPED_TRACE(std::string(dtype == torch::kFloat ? "fp32" : "bf16") + " step " +
                 std::to_string(step) + " " + layout);
    EXPECT_LE(std::abs(fused.loss - reference.loss), std::max(tol, tol * std::abs(reference.loss)))
        << "fused " << fused.loss << " reference " << reference.loss;
    const auto agreement = compare(fused, reference);
    EXPECT_GT(agreement.cosine, dtype == torch::kFloat ? 0.999999 : 0.9999);
    EXPECT_LT(agreement.relative, tol * 50) << "relative gradient-norm error";
    std::printf("fused vs reference (%s, %s, step %lld): loss %.8f vs %.8f, grad cosine %.8f, "
                "relative error %.3g\n",
                dtype == torch::kFloat ? "fp32" : "bf16", layout, static_cast<long long>(step),
                fused.loss, reference.loss, agreement.cosine, agreement.relative);
  }
}

// One replay window (A = 1) of the recipe on random inputs, with the given kernels.
// `input_scale` multiplies the target hidden states before they are cast to bf16 (1: unchanged);
// `candidates`, when given, are pinned as the reference terms' refinement candidates.
WindowResult recipe_window(const std::string& fused, double input_scale = 1.0,
                           const torch::Tensor& candidates = {}) {
  const torch::Device device(torch::kCUDA);
  auto config = train::load_run_config(
      DSPINE_SOURCE_DIR "/configs/qwen3-8b-dspine.yaml",
      {"data.source=random", "training.accumulation_steps=1", "model.fused_kernels=" + fused,
       // The reference objective holds fp32 logits per chunk; both sides chunk alike.
       "objective.dspine.objective_chunk_blocks=128"});
  data::RandomSource source(config.data, config.model, device);
  torch::manual_seed(7);
  auto objective = objectives::make_dspine_objective(
      testing::draft_config(config), config.section<objectives::DSpineSettings>("objective.dspine"),
      config.training.accumulation_steps, source.embed_tokens(), source.lm_head(), device,
      torch::kBFloat16);
  objective->on_fresh_start("");
  objective->training_model().pin_candidates(candidates);
  auto comm = dist::make_single_process_communicator();
  objectives::StepContext context;
  context.step = 10;
  context.total_steps = config.training.total_steps;
  context.comm = comm.get();
  context.seed = 123;
  std::vector<data::DraftBatch> window{source.next(config.training.batch_size)};
  window[0].hidden_states.mul_(input_scale);
  objective->begin_window(window, context);
  auto out = objective->micro_step(window[0], 0, context);
  out.loss.backward();
  const double loss = out.loss.item<double>();
  objective->end_window(context);
  auto result = gradients_of(*objective);
  result.loss = loss;
  result.candidates = objective->training_model().last_candidates();
  return result;
}

TEST(FusedDSpineStep, MatchesReferenceKernelsInLossAndGradients) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) expect_window_matches(false, dtype);
}

TEST(FusedDSpineStep, BlockAttentionHeadsMatchReferenceKernels) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // fp32 runs every other fused kernel (the block attention takes bf16 only); bf16 all of them.
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) expect_window_matches(true, dtype);
}

TEST(FusedDSpineStep, RecipeSizeGradientsMatchReferenceKernels) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const char* enabled = std::getenv("DSPINE_RECIPE_PARITY");
  if (enabled == nullptr || std::string(enabled) != "1") {
    GTEST_SKIP() << "set DSPINE_RECIPE_PARITY=1 (needs ~60 GiB of GPU memory)";
  }
  WindowResult reference = recipe_window("false");
  WindowResult fused = recipe_window("true");
  const auto agreement = compare(fused, reference);
  EXPECT_LE(std::abs(fused.loss - reference.loss), 2e-3 * std::abs(reference.loss));
  // The noise floor: the reference against itself with its inputs scaled by 1 + 2^-10, which
  // moves about a quarter of their bf16 roundings by one unit, a perturbation of the size the two
  // kernel sets' roundings differ by. Near-ties among the top-k candidates of random logits flip
  // under any such perturbation and move the refinement term's gradient.
  const auto floor = compare(recipe_window("false", 1.0 + 1.0 / 1024), reference);
  std::printf("reference vs reference with inputs x (1 + 2^-10): grad cosine %.8f, relative error "
              "%.3g\n", floor.cosine, floor.relative);
  // At random initialization the recipe's gradient is not a smooth function of bf16 roundings
  // (measured: the floor's cosine is ~0.97), so 0.9999 is out of reach for any two bf16
  // evaluations; the fused kernels must be no farther from the reference than that floor. The
  // kernels themselves are held to 0.9999 at the recipe's shapes (test_block_attention_gpu,
  // test_vocab_objective_gpu) and the whole window on the small layouts above.
  EXPECT_GE(agreement.cosine, floor.cosine - 0.01);
  std::printf("fused vs reference (bf16, recipe size): loss %.6f vs %.6f, grad cosine %.8f, "
              "relative error %.3g\n",
              fused.loss, reference.loss, agreement.cosine, agreement.relative);
  // The same candidates on both sides: the reference terms take those the fused vocabulary
  // chose. This check is much tighter than the floor above (measured on an H200: cosine 0.99629,
  // relative error 0.086, against 0.97155 and 0.239 unpinned), though not 0.9999. The likely rest
  // (not isolated): the L1 terms' gradient takes sign(p − q) per entry, another discrete choice
  // wherever p ≈ q within the roundings, which no pinning shares.
  ASSERT_TRUE(fused.candidates.defined());
  const auto pinned = recipe_window("false", 1.0, fused.candidates);
  const auto same_choice = compare(fused, pinned);
  std::printf("fused vs reference on the fused candidates (bf16, recipe size): loss %.6f vs %.6f, "
              "grad cosine %.8f, relative error %.3g\n",
              fused.loss, pinned.loss, same_choice.cosine, same_choice.relative);
  EXPECT_LE(std::abs(fused.loss - pinned.loss), 2e-3 * std::abs(pinned.loss));
  EXPECT_GE(same_choice.cosine, 0.995);
  EXPECT_LT(same_choice.relative, 0.1);
}

}  // namespace
}  // namespace dspine
