// GPU tests skip themselves on a machine without CUDA (CI's), so every test binary builds and runs
// everywhere; scripts/device_check.sh runs them where they count.
#pragma once

#include <gtest/gtest.h>
#include <torch/cuda.h>

#define REQUIRE_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA"
