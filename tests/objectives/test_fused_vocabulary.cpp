// The DSpine objective through the fused vocabulary objective (on CPU its ATen row pass) against
// the reference chunk functions on the tiny configuration in fp32: every term, the loss and every
// parameter gradient, unchunked and checkpointed, and the CE-only prepass.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>

#include "common/dspine_tiny.h"
#include "objectives/dspine_forward.h"

namespace dspine::objectives {
namespace {

using testing::mask_rows;
using testing::random_batch;
using testing::tiny_config;
using testing::tiny_settings;
using testing::training_objective;

struct Run {
  DSpineOutput out;
  std::map<std::string, torch::Tensor> grads;
};

Run run(bool fused, int64_t chunk_blocks, int64_t step, bool ce_only = false) {
  auto objective = training_objective(tiny_config(), tiny_settings(chunk_blocks));
  auto& model = objective->training_model();
  EXPECT_FALSE(model.fused_vocabulary());  // model.fused_kernels = false
  model.use_fused_vocabulary(fused);
  auto batch = random_batch(
      mask_rows({{0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1}, {0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1}}), 7);
  dist::SingleProcessCommunicator comm;
  DSpineForwardOptions options;
  options.step = step;
  options.total_steps = 600;
  options.comm = &comm;
  options.ce_only = ce_only;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
  Run r;
  if (ce_only) {
    torch::NoGradGuard no_grad;
    r.out = model.forward(batch, gen, options);
    return r;
  }
  r.out = model.forward(batch, gen, options);
  r.out.loss.backward();
  EXPECT_FALSE(model.lm_head().grad().defined());
  for (auto& p : objective->draft()->named_parameters()) {
    r.grads[p.key()] = p.value().grad().defined() ? p.value().grad().clone() : torch::Tensor();
  }
  return r;
}

void expect_close(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  ASSERT_TRUE(a.defined()) << what;
  ASSERT_TRUE(b.defined()) << what;
  const double scale = std::max(1.0, b.abs().max().item<double>());
  EXPECT_LE((a - b).abs().max().item<double>(), 1e-5 * scale)
      << what << ": " << a.flatten().slice(0, 0, 4) << " vs " << b.flatten().slice(0, 0, 4);
}

TEST(FusedVocabulary, TermsLossAndEveryGradientMatchTheReference) {
  for (int64_t step : {100, 300}) {
    for (int64_t chunk : {0, 3}) {
      const auto tag = "step " + std::to_string(step) + " chunk " + std::to_string(chunk);
      auto reference = run(false, chunk, step);
      auto fused = run(true, chunk, step);
      expect_close(fused.out.loss, reference.out.loss, tag + " loss");
      expect_close(fused.out.numerator, reference.out.numerator, tag + " numerator");
      expect_close(fused.out.ce, reference.out.ce, tag + " ce");
      expect_close(fused.out.l1, reference.out.l1, tag + " l1");
      expect_close(fused.out.refinement, reference.out.refinement, tag + " refinement");
      expect_close(fused.out.alignment, reference.out.alignment, tag + " alignment");
      expect_close(fused.out.alignment_ce, reference.out.alignment_ce, tag + " alignment CE");
      EXPECT_TRUE(torch::equal(fused.out.correct, reference.out.correct)) << tag;
      EXPECT_TRUE(torch::equal(fused.out.coverage, reference.out.coverage)) << tag;
      EXPECT_GT(reference.out.refinement.item<double>(), 0.0) << tag;
      ASSERT_EQ(fused.grads.size(), reference.grads.size());
      for (const auto& [name, grad] : reference.grads) {
        if (!grad.defined()) {
          EXPECT_FALSE(fused.grads.at(name).defined()) << tag << " " << name;
          continue;
        }
        expect_close(fused.grads.at(name), grad, tag + " grad " + name);
      }
    }
  }
}

TEST(FusedVocabulary, CeOnlyPrepassMatchesTheReference) {
  for (int64_t chunk : {0, 3}) {
    auto reference = run(false, chunk, 100, true);
    auto fused = run(true, chunk, 100, true);
    expect_close(fused.out.ce, reference.out.ce, "prepass ce");
    expect_close(fused.out.loss, reference.out.loss, "prepass loss");
    EXPECT_TRUE(torch::equal(fused.out.correct, reference.out.correct));
    EXPECT_FALSE(fused.out.l1.defined());
  }
}

}  // namespace
}  // namespace dspine::objectives
