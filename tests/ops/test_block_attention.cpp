// The fused block attention's applicability rules and its error for inputs it does not take (the
// kernels themselves are compared with the dense reference in tests/gpu/test_block_attention_gpu).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "ops/block_attention_ops.h"

namespace dspine {
namespace {

TEST(BlockAttention, HeadLayoutsTheKernelsTake) {
  EXPECT_TRUE(ops::block_attention_heads_supported(32, 8, 128, 16));  // the recipe: 64 rows
  EXPECT_TRUE(ops::block_attention_heads_supported(4, 2, 64, 8));
  EXPECT_FALSE(ops::block_attention_heads_supported(32, 8, 128, 32));  // 128 rows per block
  EXPECT_FALSE(ops::block_attention_heads_supported(4, 2, 16, 4));     // head_dim 16
  EXPECT_FALSE(ops::block_attention_heads_supported(6, 4, 128, 4));    // 6 heads over 4 kv heads
}

TEST(BlockAttention, CpuInputsAreNotFusableAndNamedInTheError) {
  auto q = torch::zeros({1, 8, 2, 64}, torch::kBFloat16);
  auto k = torch::zeros({1, 12, 2, 64}, torch::kBFloat16);
  auto anchors = torch::zeros({1, 2}, torch::kInt64);
  auto keep = torch::ones({1, 2}, torch::kBool);
  EXPECT_FALSE(ops::block_attention_fusable(q, k, 4));
  try {
    ops::block_attention(q, k, k, anchors, keep, 4, 0.125);
    FAIL() << "CPU inputs accepted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("fused block attention needs CUDA bf16"), std::string::npos) << message;
    EXPECT_NE(message.find("[1, 8, 2, 64]"), std::string::npos) << message;
  }
}

TEST(BlockAttention, ScaleOutsideThePositivesIsNamedInTheError) {
  auto q = torch::zeros({1, 8, 2, 64}, torch::kBFloat16);
  auto k = torch::zeros({1, 12, 2, 64}, torch::kBFloat16);
  auto anchors = torch::zeros({1, 2}, torch::kInt64);
  auto keep = torch::ones({1, 2}, torch::kBool);
  for (const double scale : {0.0, -0.125, std::nan("")}) {
    try {
      ops::block_attention(q, k, k, anchors, keep, 4, scale);
      FAIL() << "scale " << scale << " accepted";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("softmax scale > 0, got"), std::string::npos) << message;
    }
  }
}

}  // namespace
}  // namespace dspine
