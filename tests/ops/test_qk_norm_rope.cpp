// The q/k RMSNorm + RoPE reference on hand-built vectors and against the attention's unfused
// composition, and the fused op's refusal of CPU inputs (the kernels themselves are compared with
// the reference in tests/gpu/test_qk_norm_rope_gpu).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <utility>

#include "common/expect_error.h"
#include "ops/qk_norm_rope_ops.h"
#include "ops/rms_norm_ops.h"

namespace dspine {
namespace {

// Tables [1, 3, 4] whose last position holds cos [.5, .25, .5, .25], sin [.75, 1, .75, 1]; the
// earlier positions hold values that would show if they were used.
std::pair<torch::Tensor, torch::Tensor> hand_tables() {
  auto cos = torch::full({1, 3, 4}, 100.0f);
  auto sin = torch::full({1, 3, 4}, -100.0f);
  cos[0][2] = torch::tensor({0.5f, 0.25f, 0.5f, 0.25f});
  sin[0][2] = torch::tensor({0.75f, 1.0f, 0.75f, 1.0f});
  return {cos, sin};
}

TEST(QkNormRope, HandBuiltVectorsUseTheLastTablePositions) {
  // Two heads of D 4: rms([3, 4, 0, 0]) = 2.5, so y = w ⊙ x / 2.5; rotate_half(y) =
  // [−y2, −y3, y0, y1].
  auto x = torch::tensor({3.0f, 4.0f, 0.0f, 0.0f, 0.0f, 0.0f, 3.0f, 4.0f}).view({1, 1, 2, 4});
  auto weight = torch::tensor({1.0f, 2.0f, 1.0f, 1.0f});
  auto [cos, sin] = hand_tables();
  auto out = ops::qk_norm_rope_reference(x, weight, 0.0, cos, sin);
  // Head 0: y = [1.2, 3.2, 0, 0] → [1.2·.5, 3.2·.25, 1.2·.75, 3.2·1].
  // Head 1: y = [0, 0, 1.2, 1.6] → [−1.2·.75, −1.6·1, 1.2·.5, 1.6·.25].
  auto expected =
      torch::tensor({0.6f, 0.8f, 0.9f, 3.2f, -0.9f, -1.6f, 0.6f, 0.4f}).view({1, 1, 2, 4});
  EXPECT_TRUE(torch::allclose(out, expected, 1e-6, 1e-6)) << out;
}

// The attention's composition before the fused op existed, written out: RMSNorm over head_dim,
// then x ⊙ cos + cat(−x[D/2:], x[:D/2]) ⊙ sin with the tables' last P positions.
torch::Tensor unfused(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                      const torch::Tensor& cos, const torch::Tensor& sin) {
  auto y = ops::rms_norm_reference(x, weight, eps);
  const int64_t total = cos.size(1), rows = x.size(1), half = x.size(3) / 2;
  auto c = cos.slice(1, total - rows).unsqueeze(2);
  auto s = sin.slice(1, total - rows).unsqueeze(2);
  return y * c + torch::cat({-y.slice(-1, half), y.slice(-1, 0, half)}, -1) * s;
}

TEST(QkNormRope, ReferenceEqualsTheUnfusedCompositionExactlyInFp32) {
  torch::manual_seed(3);
  for (int64_t d : {64, 128}) {
    auto x = torch::randn({2, 37, 8, d});
    auto weight = 1 + 0.1 * torch::randn({d});
    auto angles = torch::rand({2, 50, d / 2}) * 40;
    auto cos = torch::cat({angles, angles}, -1).cos();
    auto sin = torch::cat({angles, angles}, -1).sin();
    EXPECT_TRUE(torch::equal(ops::qk_norm_rope_reference(x, weight, 1e-6, cos, sin),
                             unfused(x, weight, 1e-6, cos, sin)))
        << "D " << d;
  }
}

TEST(QkNormRope, CpuInputsAreNotFusableAndNamedInTheError) {
  auto x = torch::zeros({2, 5, 4, 64}, torch::kBFloat16);
  auto weight = torch::ones({64}, torch::kBFloat16);
  auto table = torch::zeros({2, 9, 64}, torch::kBFloat16);
  EXPECT_FALSE(ops::qk_norm_rope_fusable(x, weight, table, table));
  testing::expect_error_mentioning(
      [&] { ops::qk_norm_rope(x, weight, 1e-6, table, table); },
      {"fused q/k RMSNorm + RoPE needs CUDA", "[2, 5, 4, 64]", "BFloat16 on cpu", "[2, 9, 64]"});
}

}  // namespace
}  // namespace dspine
