// The wgmma descriptor conventions of kernels/wgmma.cuh against torch matmuls: one tile of each
// block-attention product (S = Q·Kᵀ, K-major B; O = P·V, MN-major B) through the probe kernel, in
// the attention kernels' swizzled tile layout and descriptors, must match to fp32 accumulation
// error.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/cuda/CUDAContext.h>

#include <cstdio>

#include "common/parity.h"
#include "kernels/wgmma_probe.h"

namespace dspine {
namespace {

struct Products {
  torch::Tensor s, o;
};

Products probe(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& p,
               const torch::Tensor& v) {
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(q.device());
  Products out{torch::full({64, 64}, NAN, f32), torch::full({64, 128}, NAN, f32)};
  EXPECT_EQ(kernels::wgmma_probe(q.data_ptr(), k.data_ptr(), p.data_ptr(), v.data_ptr(),
                                 out.s.data_ptr<float>(), out.o.data_ptr<float>(),
                                 at::cuda::getCurrentCUDAStream()),
            cudaSuccess);
  torch::cuda::synchronize();
  return out;
}

TEST(WgmmaProbeGpu, DescriptorsOfTheAttentionTilesMatchMatmul) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
  if (!kernels::wgmma_available()) GTEST_SKIP() << "no sm_90a code or not an sm_90 device";
  torch::manual_seed(5);
  auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  const auto q = torch::randn({64, 128}, bf16), k = torch::randn({64, 128}, bf16);
  const auto p = torch::rand({64, 64}, bf16), v = torch::randn({64, 128}, bf16);
  const auto s_expected = torch::matmul(q.to(torch::kFloat32), k.to(torch::kFloat32).t());
  const auto o_expected = torch::matmul(p.to(torch::kFloat32), v.to(torch::kFloat32));

  const auto got = probe(q, k, p, v);
  // The largest error relative to the product's largest magnitude (floor 0: purely relative).
  const double s_error = testing::max_relative_diff(got.s, s_expected, 0.0);
  const double o_error = testing::max_relative_diff(got.o, o_expected, 0.0);
  std::printf("S = Q·Kᵀ (K-major B): max error %.3g; O = P·V (MN-major B): max error %.3g\n",
              s_error, o_error);
  EXPECT_LT(s_error, 1e-5);
  EXPECT_LT(o_error, 1e-5);
}

}  // namespace
}  // namespace dspine
