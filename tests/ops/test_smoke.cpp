#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kernels/device_info.h"

TEST(Smoke, TorchAddsOnCpu) {
  auto x = torch::ones({2, 2});
  EXPECT_EQ((x + x).sum().item<float>(), 8.0f);
  EXPECT_GE(dspine::kernels::cuda_device_count(), 0);
}
