// The project's bf16 GEMM (kernels/gemm_sm90.h through ops/gemm_ops.h) against an fp32 product of
// the same bf16 operands: every shape's tail (M, N and K off the 128 × 256 × 64 tiling, N in steps
// of 8 as the TMA store of C needs), the
// residual epilogue, bitwise determinism, the operands it refuses (and the ATen path they take).
#include <gtest/gtest.h>
#include <ATen/cuda/CUDAContext.h>
#include <torch/torch.h>

#include <string>

#include "common/require_cuda.h"
#include "kernels/gemm_sm90.h"
#include "ops/gemm_ops.h"
#include "ops/swiglu_ops.h"

namespace dspine {
namespace {

const torch::Device kCuda(torch::kCUDA, 0);

bool hopper() {
  return torch::cuda::is_available() && at::cuda::getCurrentDeviceProperties()->major == 9;
}

struct Shape {
  int64_t m, n, k;
};

std::string name(const Shape& s) {
  return std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
}

// The largest difference from the fp32 product, in units of the output's bf16 spacing at its
// largest value: one rounding of an fp32 sum is within half a unit; cuBLAS is measured alike.
double error_in_ulps(const torch::Tensor& out, const torch::Tensor& exact) {
  const double scale = exact.abs().max().item<double>();
  const double ulp = std::ldexp(1.0, static_cast<int>(std::floor(std::log2(scale))) - 7);
  return (out.to(torch::kFloat32) - exact).abs().max().item<double>() / ulp;
}

TEST(OwnGemm, MatchesTheFp32ProductOnEveryTail) {
  REQUIRE_CUDA();
  if (!hopper()) GTEST_SKIP() << "the GEMM runs on compute capability 9.0";
  torch::manual_seed(3);
  const auto bf16 = torch::TensorOptions(kCuda).dtype(torch::kBFloat16);
  for (const Shape s : {Shape{1, 8, 8}, Shape{300, 520, 200}, Shape{129, 264, 72},
                        Shape{128, 256, 64}, Shape{2048, 4096, 4096}, Shape{517, 1032, 1032}}) {
    const auto x = torch::randn({s.m, s.k}, bf16), w = torch::randn({s.n, s.k}, bf16);
    const auto r = torch::randn({s.m, s.n}, bf16);
    ASSERT_TRUE(ops::own_gemm_takes(x, w, r)) << name(s);
    const auto exact = x.to(torch::kFloat32).mm(w.to(torch::kFloat32).t());
    const auto out = ops::linear_rows(x, w);
    ASSERT_EQ(out.sizes(), (std::vector<int64_t>{s.m, s.n})) << name(s);
    EXPECT_LE(error_in_ulps(out, exact), 0.5 + 1e-3 * s.k) << name(s);
    EXPECT_LE(error_in_ulps(at::mm(x, w.t()), exact), 0.5 + 1e-3 * s.k) << name(s) << " cuBLAS";
    const auto with_residual = ops::linear_rows(x, w, r);
    EXPECT_LE(error_in_ulps(with_residual, exact + r.to(torch::kFloat32)), 0.5 + 1e-3 * s.k)
        << name(s) << " + residual";
    EXPECT_TRUE(torch::equal(ops::linear_rows(x, w), out)) << name(s) << " deterministic";
  }
}

// The SwiGLU epilogue: gate_up as the plain product would write it, and an activation equal bit for
// bit to the SwiGLU kernel's on that gate_up (what the backward recomputes), on tails of M, I, K.
TEST(OwnGemm, SwiGLUEpilogueWritesGateUpAndTheKernelsActivation) {
  REQUIRE_CUDA();
  if (!hopper()) GTEST_SKIP() << "the GEMM runs on compute capability 9.0";
  torch::manual_seed(4);
  const auto bf16 = torch::TensorOptions(kCuda).dtype(torch::kBFloat16);
  for (const Shape s : {Shape{1, 2, 8}, Shape{300, 200, 72}, Shape{129, 384, 1032},
                        Shape{2048, 1536, 4096}}) {  // (M, I, K)
    const auto x = torch::randn({s.m, s.k}, bf16), w = torch::randn({2 * s.n, s.k}, bf16) * 0.1;
    auto gate_up = torch::empty({s.m, 2 * s.n}, bf16), act = torch::empty({s.m, s.n}, bf16);
    ASSERT_EQ(
        kernels::gemm_bf16_swiglu(x.data_ptr(), w.data_ptr(), gate_up.data_ptr(), act.data_ptr(),
                                  s.m, s.n, s.k, at::cuda::getCurrentCUDAStream()),
        cudaSuccess)
        << name(s);
    const auto exact = x.to(torch::kFloat32).mm(w.to(torch::kFloat32).t());
    EXPECT_LE(error_in_ulps(gate_up, exact), 0.5 + 1e-3 * s.k) << name(s);
    const auto halves = gate_up.chunk(2, -1);
    EXPECT_TRUE(
        torch::equal(act, ops::swiglu_fused(halves[0].contiguous(), halves[1].contiguous())))
        << name(s) << " activation";
  }
}

TEST(OwnGemm, RefusesWhatItDoesNotTakeAndAtenComputesIt) {
  REQUIRE_CUDA();
  const auto bf16 = torch::TensorOptions(kCuda).dtype(torch::kBFloat16);
  const auto x = torch::randn({64, 100}, bf16), w = torch::randn({32, 100}, bf16);
  struct Case {
    const char* what;
    torch::Tensor x, w, r;
  };
  const Case cases[] = {
      {"K not a multiple of 8", x, w, {}},
      {"N not a multiple of 8", torch::randn({64, 64}, bf16), torch::randn({36, 64}, bf16), {}},
      {"fp32", x.to(torch::kFloat32), w.to(torch::kFloat32), {}},
      {"strided rows",
       torch::randn({64, 208}, bf16).narrow(1, 0, 104),
       torch::randn({32, 104}, bf16),
       {}},
      {"no rows", torch::randn({0, 64}, bf16), torch::randn({32, 64}, bf16), {}},
      {"residual of another shape", torch::randn({64, 64}, bf16), torch::randn({32, 64}, bf16),
       torch::randn({64, 31}, bf16)},
  };
  for (const auto& c : cases) {
    EXPECT_FALSE(ops::own_gemm_takes(c.x, c.w, c.r)) << c.what;
    if (c.r.defined()) continue;  // a residual of another shape is the caller's error
    EXPECT_TRUE(torch::equal(ops::linear_rows(c.x, c.w), at::mm(c.x, c.w.t()))) << c.what;
  }
  // The ATen path adds the residual after at::mm's rounding.
  const auto xs = torch::randn({64, 104}, bf16).narrow(1, 0, 100).contiguous();
  const auto r = torch::randn({64, 32}, bf16);
  EXPECT_TRUE(torch::equal(ops::linear_rows(xs, w, r), at::mm(xs, w.t()) + r));
}

}  // namespace
}  // namespace dspine
