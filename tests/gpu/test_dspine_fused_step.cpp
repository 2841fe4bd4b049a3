// A full DSpine window (CE-only prepass + replay, A = 2) with fused CUDA RMSNorm/SwiGLU equals the
// same window with the reference ATen modules (the reference's test T34): loss, every gradient
// (cosine and relative norm error), for fp32 and bf16, at two points of the replacement schedule.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/config.h"
#include "dist/communicator.h"
#include "objectives/dspine_objective.h"
#include "objectives/dspine_settings.h"

namespace dspine {
namespace {

core::Config step_config(const std::string& fused) {
  core::Config c;
  auto& m = c.model;
  m.architecture = "dspine";
  m.hidden_size = 64;
  m.intermediate_size = 128;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 16;
  m.num_hidden_layers = 2;
  m.vocab_size = 256;
  m.block_size = 4;
  m.mask_token_id = 255;
  m.target_layer_ids = {0, 1, 2};
  m.fused_kernels = fused;
  m.dspine.transfer_rank = 32;
  m.dspine.message_size = 16;
  m.dspine.top_k = 8;
  c.training.accumulation_steps = 2;
  c.objective.name = "dspine";
  return c;
}

data::DraftBatch random_batch(int64_t seed) {
  torch::manual_seed(seed);
  data::DraftBatch b;
  b.input_ids = torch::randint(0, 255, {2, 32}, torch::kInt64);
  b.loss_mask = torch::ones({2, 32}, torch::kInt64);
  b.loss_mask.slice(1, 0, 4).zero_();
  b.hidden_states = torch::randn({2, 32, 3 * 64});
  b.target_last_hidden_states = torch::randn({2, 32, 64});
  return b;
}

struct WindowResult {
  double loss = 0;
  std::map<std::string, torch::Tensor> grads;
};

WindowResult run_window(const std::string& fused, torch::Dtype dtype, int64_t step) {
  const torch::Device device(torch::kCUDA);
  torch::manual_seed(5);
  auto head = torch::randn({256, 64}) * 0.3;
  auto embed = torch::randn({256, 64});
  objectives::DSpineSettings settings;
  settings.num_anchors = 8;
  settings.objective_chunk_blocks = 4;
  auto objective =
      objectives::make_dspine_objective(step_config(fused), settings, embed, head, device, dtype);
  objective->on_fresh_start();
  auto comm = dist::make_single_process_communicator();
  objectives::StepContext context;
  context.step = step;
  context.total_steps = 600;
  context.comm = comm.get();
  context.generator = at::make_generator<at::CPUGeneratorImpl>(123);
  std::vector<data::DraftBatch> window{random_batch(1).to(device), random_batch(2).to(device)};
  objective->begin_window(window, context);
  WindowResult result;
  for (int64_t i = 0; i < 2; ++i) {
    auto out = objective->micro_step(window[i], i, context);
    out.loss.backward();
    result.loss += out.loss.item<double>();
  }
  objective->end_window(context);
  for (auto& p : objective->module()->named_parameters()) {
    if (p.value().grad().defined()) result.grads[p.key()] = p.value().grad().to(torch::kDouble).cpu();
  }
  return result;
}

TEST(FusedDSpineStep, MatchesReferenceKernelsInLossAndGradients) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const double tol = dtype == torch::kFloat ? 2e-5 : 2e-2;
    for (int64_t step : {100, 300}) {
      auto reference = run_window("false", dtype, step);
      auto fused = run_window("true", dtype, step);
      SCOPED_TRACE(std::string(dtype == torch::kFloat ? "fp32" : "bf16") + " step " +
                   std::to_string(step));
      EXPECT_LE(std::abs(fused.loss - reference.loss), std::max(tol, tol * std::abs(reference.loss)))
          << "fused " << fused.loss << " reference " << reference.loss;
      ASSERT_EQ(fused.grads.size(), reference.grads.size());
      std::vector<torch::Tensor> a, b;
      for (const auto& [name, grad] : reference.grads) {
        a.push_back(grad.reshape(-1));
        b.push_back(fused.grads.at(name).reshape(-1));
      }
      auto ga = torch::cat(a), gb = torch::cat(b);
      const double cosine = (ga * gb).sum().item<double>() / (ga.norm() * gb.norm()).item<double>();
      const double relative = (ga - gb).norm().item<double>() / ga.norm().item<double>();
      EXPECT_GT(cosine, 0.999);
      EXPECT_LT(relative, tol * 50) << "relative gradient-norm error";
      std::printf("fused vs reference (%s, step %lld): loss %.8f vs %.8f, grad cosine %.8f, "
                  "relative error %.3g\n",
                  dtype == torch::kFloat ? "fp32" : "bf16", static_cast<long long>(step),
                  fused.loss, reference.loss, cosine, relative);
    }
  }
}

}  // namespace
}  // namespace dspine
