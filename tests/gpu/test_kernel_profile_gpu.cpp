// The step benchmark's kernel profile on a GPU: Kineto records CUDA kernels and copies, and a
// matmul, an elementwise op, a reduction and a device-to-host copy land in their categories.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <set>
#include <string>

#include "bench/kernel_profile.h"

namespace dspine::bench {
namespace {

TEST(KernelProfileGpu, GroupsCudaKernelsIntoCategories) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto options = torch::TensorOptions(torch::kCUDA).dtype(torch::kBFloat16);
  auto a = torch::randn({1024, 1024}, options);
  torch::cuda::synchronize();
  start_kernel_profile(/*cuda=*/true);
  auto product = torch::matmul(a, a);
  auto shifted = (product + 1).relu();
  auto total = shifted.sum().to(torch::kCPU);
  torch::cuda::synchronize();
  auto profile = stop_kernel_profile();
  ASSERT_TRUE(profile.unavailable.empty()) << profile.unavailable;
  ASSERT_TRUE(profile.device) << "Kineto recorded no CUDA activity (is CUPTI loadable?)";
  profile.wall_ms = 1.0;
  print_kernel_profile(profile, stdout, 0);  // into the test log

  std::set<std::string> categories;
  std::string names;
  for (const auto& row : profile.rows) {
    categories.insert(row.category);
    names += row.name + " (" + row.category + "); ";
    EXPECT_GE(row.calls, 1);
    EXPECT_GE(row.total_ms, 0.0);
  }
  for (const char* expected : {"gemm", "elementwise", "reduction", "memcpy/memset"}) {
    EXPECT_TRUE(categories.count(expected)) << "no " << expected << " kernel among: " << names;
  }
  EXPECT_GT(profile.kernel_ms(), 0.0);
  // One stream: the kernels run one after another, so their span covers their sum.
  EXPECT_GE(profile.span_ms, profile.kernel_ms() - 1e-3);
  EXPECT_TRUE(std::isfinite(total.item<float>()));
}

}  // namespace
}  // namespace dspine::bench
