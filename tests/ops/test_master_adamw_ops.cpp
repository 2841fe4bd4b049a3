// The master AdamW front end's refusals on any machine (its arithmetic is tested on CUDA, bitwise
// against ATen's fused AdamW, in tests/gpu/test_master_adamw_gpu.cpp): tensors the kernel does not
// take are named with their dtype, shape and device, and nothing is written.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "core/error.h"
#include "ops/master_adamw_ops.h"

namespace dspine {
namespace {

std::string refusal(torch::Tensor master, const torch::Tensor& grad, torch::Tensor exp_avg,
                    torch::Tensor exp_avg_sq, const torch::Tensor& weights) {
  try {
    ops::master_adamw_step(master, grad, exp_avg, exp_avg_sq, weights, ops::AdamWStep{});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MasterAdamWOps, RefusesTensorsItDoesNotTakeByName) {
  const auto master = torch::zeros({6});
  const auto before = master.clone();
  const std::string cpu =
      refusal(master, torch::zeros({6}), torch::zeros({6}), torch::zeros({6}), torch::Tensor());
  EXPECT_NE(cpu.find("does not take the master: Float [6] on cpu"), std::string::npos) << cpu;
  EXPECT_TRUE(torch::equal(master, before));
  if (!torch::cuda::is_available()) return;
  const auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat);
  const std::string grad = refusal(torch::zeros({6}, f32), torch::zeros({5}, f32),
                                   torch::zeros({6}, f32), torch::zeros({6}, f32), torch::Tensor());
  EXPECT_NE(grad.find("does not take the gradient: Float [5]"), std::string::npos) << grad;
  const std::string moment = refusal(torch::zeros({6}, f32), torch::zeros({6}, f32),
                                     torch::zeros({6}, f32.dtype(torch::kBFloat16)),
                                     torch::zeros({6}, f32), torch::Tensor());
  EXPECT_NE(moment.find("does not take a moment: BFloat16 [6]"), std::string::npos) << moment;
  const std::string weights =
      refusal(torch::zeros({6}, f32), torch::zeros({6}, f32), torch::zeros({6}, f32),
              torch::zeros({6}, f32), torch::zeros({6}, f32.dtype(torch::kHalf)));
  EXPECT_NE(weights.find("does not take the weights: Half [6]"), std::string::npos) << weights;
}

}  // namespace
}  // namespace dspine
