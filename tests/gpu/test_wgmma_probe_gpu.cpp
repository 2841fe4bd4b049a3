// The wgmma descriptor conventions of kernels/wgmma.cuh against torch matmuls: one tile of each
// block-attention product (S = Q·Kᵀ, K-major B; O = P·V, MN-major B) through the probe kernel with
// the offsets the attention kernels use must match to fp32 accumulation error. The swapped
// offsets are run too and reported, so a failure says which assignment the hardware follows.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/cuda/CUDAContext.h>

#include <cstdio>

#include "kernels/wgmma_probe.h"

namespace dspine {
namespace {

struct Products {
  torch::Tensor s, o;
};

Products probe(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& p,
               const torch::Tensor& v, kernels::WgmmaProbeOffsets offsets) {
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(q.device());
  Products out{torch::full({64, 64}, NAN, f32), torch::full({64, 128}, NAN, f32)};
  EXPECT_EQ(kernels::wgmma_probe(q.data_ptr(), k.data_ptr(), p.data_ptr(), v.data_ptr(),
                                 out.s.data_ptr<float>(), out.o.data_ptr<float>(), offsets,
                                 at::cuda::getCurrentCUDAStream()),
            cudaSuccess);
  torch::cuda::synchronize();
  return out;
}

double max_error(const torch::Tensor& got, const torch::Tensor& expected) {
  return ((got - expected).abs().max() / expected.abs().max()).item<double>();
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

  const kernels::WgmmaProbeOffsets used;
  const auto got = probe(q, k, p, v, used);
  const double s_error = max_error(got.s, s_expected), o_error = max_error(got.o, o_expected);
  kernels::WgmmaProbeOffsets swapped;
  swapped.k_leading = used.k_stride;
  swapped.k_stride = used.k_leading;
  swapped.v_leading = used.v_stride;
  swapped.v_stride = used.v_leading;
  const auto other = probe(q, k, p, v, swapped);
  std::printf("S = Q·Kᵀ (K-major B): max error %.3g with leading/stride %d/%d, %.3g swapped\n",
              s_error, used.k_leading, used.k_stride, max_error(other.s, s_expected));
  std::printf("O = P·V (MN-major B): max error %.3g with leading/stride %d/%d, %.3g swapped\n",
              o_error, used.v_leading, used.v_stride, max_error(other.o, o_expected));
  EXPECT_LT(s_error, 1e-5);
  EXPECT_LT(o_error, 1e-5);
}

}  // namespace
}  // namespace dspine
