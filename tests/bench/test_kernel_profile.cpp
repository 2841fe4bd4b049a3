// The step benchmark's kernel profile: name shortening and categories on real kernel names, and a
// CPU run, which has no device activity and reports its CPU operators without failing.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdio>
#include <string>

#include "bench/kernel_profile.h"

namespace dspine::bench {
namespace {

TEST(KernelProfile, ShortensKernelNames) {
  EXPECT_EQ(shorten_kernel_name(
                "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous "
                "namespace)::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >(int, "
                "at::native::(anonymous namespace)::CUDAFunctor_add<c10::BFloat16>, "
                "std::array<char*, 3ul>)"),
            "vectorized_elementwise_kernel[CUDAFunctor_add]");
  EXPECT_EQ(shorten_kernel_name("nvjet_tst_256x128_64x4_2x1_v_bz_coopA_NNT"),
            "nvjet_tst_256x128_64x4_2x1_v_bz_coopA_NNT");
  EXPECT_EQ(shorten_kernel_name("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_"
                                "bf16_32x32_128x2_tn_align8>(Params)"),
            "Kernel2[cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8]");
  EXPECT_EQ(shorten_kernel_name("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgs)"),
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL");
  EXPECT_LE(shorten_kernel_name(std::string(200, 'x')).size(), 80u);
}

TEST(KernelProfile, Categories) {
  EXPECT_EQ(kernel_category("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", false),
            "gemm");
  EXPECT_EQ(kernel_category("nvjet_tst_256x128_64x4_2x1_v_bz_coopA_NNT", false), "gemm");
  EXPECT_EQ(kernel_category("fmha_cutlassB_bf16_aligned_64x64_k128_sm80", false), "attention");
  EXPECT_EQ(kernel_category("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>", false),
            "attention");
  EXPECT_EQ(kernel_category("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", false), "nccl");
  EXPECT_EQ(kernel_category("void at::native::reduce_kernel<512, 1>", false), "reduction");
  EXPECT_EQ(kernel_category("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4>",
                            false),
            "reduction");
  EXPECT_EQ(kernel_category("void at::native::vectorized_elementwise_kernel<4>", false),
            "elementwise");
  EXPECT_EQ(kernel_category("Memcpy DtoD (Device -> Device)", true), "memcpy/memset");
  EXPECT_EQ(kernel_category("some_custom_kernel", false), "other");
}

TEST(KernelProfile, CpuRunReportsOperatorsWithoutDeviceActivity) {
  start_kernel_profile(/*cuda=*/false);
  auto a = torch::randn({64, 64});
  auto b = torch::mm(a, a).relu().sum();
  b.item<float>();
  auto profile = stop_kernel_profile();
  ASSERT_TRUE(profile.unavailable.empty()) << profile.unavailable;
  EXPECT_FALSE(profile.device);
  bool saw_mm = false;
  for (const auto& row : profile.rows) {
    EXPECT_GE(row.calls, 1);
    saw_mm = saw_mm || row.name == "aten::mm";
  }
  EXPECT_TRUE(saw_mm);

  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  print_kernel_profile(profile, out, 0);
  std::rewind(out);
  std::string text(4096, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), out));
  std::fclose(out);
  EXPECT_NE(text.find("no CUDA activity recorded"), std::string::npos) << text;
  EXPECT_NE(text.find("| aten::mm |"), std::string::npos) << text;
}

}  // namespace
}  // namespace dspine::bench
