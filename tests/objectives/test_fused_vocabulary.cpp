// The DSpine objective through the fused vocabulary objective (on CPU its ATen row pass) against
// the reference chunk functions on the tiny configuration in fp32: every term, the loss and every
// parameter gradient, unchunked and checkpointed, and the CE-only prepass.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <sstream>
#include <string>

#include "common/dspine_tiny.h"
#include "common/parity.h"
#include "core/error.h"
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
  torch::Tensor candidates;  // the fused path's refinement candidates
};

Run run(bool fused, int64_t chunk_blocks, int64_t step, bool ce_only = false,
        const torch::Tensor& pinned = {}) {
  auto objective = training_objective(tiny_config(), tiny_settings(chunk_blocks));
  auto& model = objective->training_model();
  EXPECT_FALSE(model.fused_vocabulary());  // model.fused_kernels = false
  model.use_fused_vocabulary(fused);
  model.pin_candidates(pinned);
  auto batch = random_batch(
      mask_rows({{0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1}, {0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1}}), 7);
  dist::SingleProcessCommunicator comm;
  DSpineForwardOptions options;
  options.step = step;
  options.total_steps = 600;
  options.comm = &comm;
  options.ce_only = ce_only;
  const RowStreams gen{42, 0, 0};
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
  r.candidates = model.last_candidates();
  return r;
}

// Both defined, and within 1e-5 of the reference's scale (testing::expect_close); a failure also
// shows the first values of each.
void expect_close(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  ASSERT_TRUE(a.defined()) << what;
  ASSERT_TRUE(b.defined()) << what;
  std::ostringstream first;
  first << a.flatten().slice(0, 0, 4) << " vs " << b.flatten().slice(0, 0, 4);
  SCOPED_TRACE(first.str());
  testing::expect_close(a, b, 1e-5, what);
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

// Pinned candidates, for parity checks between kernel sets that break near-ties differently: the
// reference terms on the fused path's candidates give its objective and gradients; on other
// candidates their refinement term moves; the fused path and a wrong shape refuse them.
TEST(FusedVocabulary, ReferenceTermsTakePinnedCandidates) {
  for (int64_t chunk : {0, 3}) {
    const auto tag = "chunk " + std::to_string(chunk);
    auto fused = run(true, chunk, 100);
    ASSERT_TRUE(fused.candidates.defined());
    EXPECT_EQ(fused.candidates.dim(), 3);
    auto pinned = run(false, chunk, 100, false, fused.candidates);
    expect_close(pinned.out.loss, fused.out.loss, tag + " loss");
    expect_close(pinned.out.refinement, fused.out.refinement, tag + " refinement");
    EXPECT_TRUE(torch::equal(pinned.out.coverage, fused.out.coverage)) << tag;
    for (const auto& [name, grad] : fused.grads) {
      if (grad.defined()) expect_close(pinned.grads.at(name), grad, tag + " grad " + name);
    }
    const int64_t vocab = tiny_config().model.vocab_size;
    auto other = run(false, chunk, 100, false, (fused.candidates + 1).remainder(vocab));
    EXPECT_GT((other.out.refinement - fused.out.refinement).abs().item<double>(), 1e-4) << tag;
  }
  auto fused = run(true, 0, 100);
  EXPECT_THROW(run(true, 0, 100, false, fused.candidates), Error);
  EXPECT_THROW(run(false, 0, 100, false, fused.candidates.slice(2, 1)), Error);
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
