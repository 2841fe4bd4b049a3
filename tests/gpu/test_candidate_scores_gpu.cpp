// The candidate-score kernels (src/kernels/candidate_scores.cu) against the ATen reference (the
// candidates' LM-head rows gathered, then a batched matrix-vector product): scores and the refined
// states' gradient both against fp64 evaluations of the same bf16 inputs, where the kernels must be
// at least as close as the reference; k from 1 to 32, repeated candidates, an id out of range
// (NaN, no gradient), non-contiguous inputs, and the recipe's sizes (k 16, H 4096).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "common/parity.h"
#include "common/require_cuda.h"
#include "ops/candidate_scores_ops.h"

namespace dspine {
namespace {

const torch::Device kCuda(torch::kCUDA, 0);

struct Result {
  torch::Tensor scores, grad;
};

// Σ w · scores backward through `fused` or the reference; the truth runs the reference in fp64.
Result run(const torch::Tensor& table, const torch::Tensor& ids, const torch::Tensor& x,
           const torch::Tensor& w, bool fused) {
  auto leaf = x.clone().requires_grad_(true);
  const auto scores = fused ? ops::candidate_scores_fused(table, ids, leaf)
                            : ops::candidate_scores_reference(table, ids, leaf);
  (w * scores).sum().backward();
  return {scores.detach(), leaf.grad()};
}

void expect_parity(int64_t blocks, int64_t positions, int64_t k, int64_t hidden, int64_t vocab) {
  torch::manual_seed(11);
  const auto f32 = torch::TensorOptions().device(kCuda).dtype(torch::kFloat);
  const auto table = (torch::randn({vocab, hidden}, f32) * 0.05).to(torch::kBFloat16);
  const auto x = torch::randn({blocks, positions, hidden}, f32).to(torch::kBFloat16);
  auto ids = torch::randint(vocab, {blocks, positions, k}, f32.dtype(torch::kLong));
  if (k > 1) ids.select(-1, 1).copy_(ids.select(-1, 0));  // a repeated candidate
  const auto w = torch::randn({blocks, positions, k}, f32);
  ASSERT_TRUE(ops::candidate_scores_fusable(table, ids, x));
  const auto fused = run(table, ids, x, w, true);
  const auto reference = run(table, ids, x, w, false);
  const auto truth = run(table.to(torch::kDouble), ids, x.to(torch::kDouble), w.to(torch::kDouble),
                         false);
  const std::string what = "k " + std::to_string(k) + " hidden " + std::to_string(hidden);
  // fp32 sums of bf16 products against fp64: the reference also rounds its scores to bf16.
  const double fused_error = testing::max_abs_diff(fused.scores, truth.scores.to(torch::kFloat));
  const double reference_error =
      testing::max_abs_diff(reference.scores, truth.scores.to(torch::kFloat));
  EXPECT_LE(fused_error, 1e-4 * std::sqrt(static_cast<double>(hidden))) << what;
  EXPECT_LE(fused_error, reference_error + 1e-6) << what;
  EXPECT_LE(testing::norm_relative_error(fused.grad, truth.grad.to(torch::kFloat)), 4e-3) << what;
  EXPECT_GE(testing::cosine(fused.grad, reference.grad), 0.99999) << what;
}

TEST(CandidateScoresGpu, MatchesTheGatheredProductAcrossSizes) {
  REQUIRE_CUDA();
  for (const int64_t k : {1, 3, 4, 5, 16, 17, 32}) expect_parity(7, 5, k, 264, 1000);
  expect_parity(3, 2, 16, 8, 50);  // one pack per row
}

TEST(CandidateScoresGpu, MatchesAtTheRecipesSize) {
  REQUIRE_CUDA();
  expect_parity(64, 15, 16, 4096, 151936);
}

TEST(CandidateScoresGpu, AnIdOutOfRangeScoresNaNAndSendsNoGradient) {
  REQUIRE_CUDA();
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  const auto table = torch::randn({10, 16}, bf16);
  auto ids = torch::tensor({{3, 10, 2}, {-1, 4, 4}}, torch::TensorOptions(kCuda).dtype(torch::kLong));
  auto x = torch::randn({2, 16}, bf16).requires_grad_(true);
  const auto scores = ops::candidate_scores_fused(table, ids, x);
  EXPECT_TRUE(std::isnan(scores[0][1].item<float>()));
  EXPECT_TRUE(std::isnan(scores[1][0].item<float>()));
  EXPECT_FALSE(std::isnan(scores[0][0].item<float>()));
  // Only the valid candidates' rows reach the gradient (the NaN scores get weight 0 here).
  const auto w = torch::tensor({{1.0f, 0.0f, 2.0f}, {0.0f, 1.0f, -1.0f}},
                               torch::TensorOptions(kCuda));
  torch::autograd::backward({scores}, {w});
  const auto t = table.to(torch::kFloat);
  const auto expected = torch::stack({t[3] + 2 * t[2], t[4] - t[4]});
  testing::expect_allclose(x.grad().to(torch::kFloat), expected, 1e-2, 1e-2, "gradient");
}

TEST(CandidateScoresGpu, TakesNonContiguousInputs) {
  REQUIRE_CUDA();
  torch::manual_seed(12);
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  const auto table = torch::randn({300, 64}, bf16);
  const auto x = torch::randn({9, 4, 72}, bf16).narrow(2, 3, 64);  // rows 16-byte misaligned
  const auto ids = torch::randint(300, {4, 9, 5}, bf16.dtype(torch::kLong)).transpose(0, 1);
  ASSERT_TRUE(ops::candidate_scores_fusable(table, ids, x));
  const auto fused = ops::candidate_scores_fused(table, ids, x);
  const auto reference = ops::candidate_scores_reference(table.to(torch::kFloat), ids,
                                                         x.to(torch::kFloat));
  testing::expect_allclose(fused, reference, 1e-4, 1e-4, "scores");
}

}  // namespace
}  // namespace dspine
