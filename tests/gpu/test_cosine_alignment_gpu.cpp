// The alignment cosine's kernels (src/kernels/cosine_alignment.cu) against the ATen reference
// (cosine_similarity of the widened features with the broadcast codes): values to 2e-6 and the
// features' gradient to 1e-5 relative in fp32, to one bf16 rounding in bf16 (both paths compute
// in fp32 from the same bf16 features), and both against fp64; strided feature views as the
// objective passes them, a zero code (its norm clamped), and rank 1024 as at the recipe's size.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "common/parity.h"
#include "common/require_cuda.h"
#include "ops/cosine_alignment_ops.h"

namespace dspine {
namespace {

using testing::expect_allclose;

const torch::Device kCuda(torch::kCUDA, 0);
constexpr double kEps = 1e-8;

struct Result {
  torch::Tensor cosine, grad;
};

// Σ w · (1 - cos) backward, w per row as the objective's weights, from a copy of `features`
// viewed as `view` (a slice along the positions, like the objective's proposals).
Result run(const torch::Tensor& base, const torch::Tensor& codes, const torch::Tensor& weights,
           bool fused) {
  auto leaf = base.clone().requires_grad_(true);
  const auto features = leaf.slice(2, 1);
  // fp64 inputs: ATen's cosine in fp64 itself, the truth both paths are measured against.
  const auto cosine = fused ? ops::cosine_alignment_fused(features, codes, kEps)
                      : base.scalar_type() == torch::kDouble
                          ? at::cosine_similarity(features, codes.unsqueeze(1), -1, kEps)
                          : ops::cosine_alignment_reference(features, codes, kEps);
  (weights.unsqueeze(1) * (1.0 - cosine)).sum().backward();
  return {cosine.detach(), leaf.grad().slice(2, 1)};
}

void expect_parity(torch::Dtype dtype, int64_t rank) {
  torch::manual_seed(5);
  const int64_t blocks = 37, layers = 5, positions = 15;
  const auto f32 = torch::TensorOptions().device(kCuda).dtype(torch::kFloat);
  const auto base = torch::randn({blocks, layers, positions + 1, rank}, f32).to(dtype);
  auto codes = torch::randn({blocks, positions, rank}, f32);
  codes[3][4].zero_();  // a code of norm 0: clamped at eps, cosine 0
  const auto weights = torch::rand({blocks, positions}, f32);
  ASSERT_TRUE(ops::cosine_alignment_fusable(base.slice(2, 1), codes));
  const auto fused = run(base, codes, weights, true);
  const auto reference = run(base, codes, weights, false);
  const auto truth =
      run(base.to(torch::kDouble), codes.to(torch::kDouble), weights.to(torch::kDouble), false);
  const std::string what =
      std::string(dtype == torch::kFloat ? "fp32" : "bf16") + " rank " + std::to_string(rank);
  expect_allclose(fused.cosine, reference.cosine, 2e-6, 2e-6, what + " cosine vs reference");
  expect_allclose(fused.cosine, truth.cosine, 2e-6, 2e-6, what + " cosine vs fp64");
  EXPECT_EQ(fused.cosine[3].select(1, 4).abs().max().item<float>(), 0.0f) << what;
  // bf16 gradients: both round an fp32 value once, so they differ by at most one bf16 ulp.
  const double rtol = dtype == torch::kFloat ? 1e-5 : 8e-3;
  const double atol = rtol * reference.grad.abs().max().item<double>();
  expect_allclose(fused.grad, reference.grad, rtol, atol, what + " gradient vs reference");
  expect_allclose(fused.grad, truth.grad, rtol, atol, what + " gradient vs fp64");
}

TEST(CosineAlignmentGpu, Fp32MatchesReference) {
  REQUIRE_CUDA();
  expect_parity(torch::kFloat, 1024);
  expect_parity(torch::kFloat, 40);
}

TEST(CosineAlignmentGpu, Bf16MatchesReference) {
  REQUIRE_CUDA();
  expect_parity(torch::kBFloat16, 1024);
  expect_parity(torch::kBFloat16, 264);
}

TEST(CosineAlignmentGpu, RefusesWhatTheKernelsDoNotTake) {
  REQUIRE_CUDA();
  const auto f32 = torch::TensorOptions().device(kCuda).dtype(torch::kFloat);
  const auto codes = torch::randn({2, 3, 12}, f32);
  EXPECT_FALSE(ops::cosine_alignment_fusable(torch::randn({2, 4, 3, 12}, f32), codes));  // 12 % 8
  EXPECT_FALSE(ops::cosine_alignment_fusable(torch::randn({2, 4, 3, 16}, f32), codes));  // shape
  EXPECT_FALSE(ops::cosine_alignment_fusable(torch::randn({2, 4, 3, 12}), codes.cpu()));
  EXPECT_THROW(ops::cosine_alignment_fused(torch::randn({2, 4, 3, 16}, f32), codes, kEps),
               std::exception);
}

}  // namespace
}  // namespace dspine
