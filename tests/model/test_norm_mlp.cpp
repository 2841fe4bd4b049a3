// The kernel factory on a machine without CUDA: the choice per device, the reference modules'
// values and parameter names, and clear errors when fused kernels are demanded without CUDA.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <string>

#include "core/error.h"
#include "model/norm_mlp.h"
#include "ops/rms_norm_ops.h"
#include "ops/swiglu_ops.h"

namespace dspine::model {
namespace {

using core::FusedKernels;

std::set<std::string> parameter_names(const torch::nn::Module& module) {
  std::set<std::string> names;
  for (const auto& item : module.named_parameters()) names.insert(item.key());
  return names;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(KernelFactory, AutoAndFalsePickTheReferenceOnCpu) {
  EXPECT_FALSE(use_fused_kernels(FusedKernels::kAuto, torch::kCPU));
  EXPECT_FALSE(use_fused_kernels(FusedKernels::kOff, torch::kCPU));
}

TEST(KernelFactory, AutoAndTruePickFusedOnCuda) {
  EXPECT_TRUE(use_fused_kernels(FusedKernels::kAuto, torch::Device(torch::kCUDA, 0)));
  EXPECT_TRUE(use_fused_kernels(FusedKernels::kOn, torch::Device(torch::kCUDA, 0)));
  EXPECT_FALSE(use_fused_kernels(FusedKernels::kOff, torch::Device(torch::kCUDA, 0)));
}

TEST(KernelFactory, TrueWithoutCudaIsAClearError) {
  const std::string message = error_of([] { use_fused_kernels(FusedKernels::kOn, torch::kCPU); });
  EXPECT_NE(message.find("CUDA"), std::string::npos) << message;
  EXPECT_NE(message.find("fused_kernels"), std::string::npos) << message;
}

TEST(KernelFactory, FusedModulesRejectCpuInputsNamingCuda) {
  RMSNorm norm(8, 1e-6, /*fused=*/true);
  SwiGLUMLP mlp(8, 16, /*fused=*/true);
  const auto x = torch::randn({2, 8});
  EXPECT_NE(error_of([&] { norm(x); }).find("CUDA"), std::string::npos);
  EXPECT_NE(error_of([&] { norm->forward_add(x, x); }).find("CUDA"), std::string::npos);
  EXPECT_NE(error_of([&] { mlp(x); }).find("CUDA"), std::string::npos);
}

TEST(KernelFactory, ParameterNamesAreIdenticalFusedOrNot) {
  const std::set<std::string> norm_names{"weight"};
  EXPECT_EQ(parameter_names(*RMSNorm(8, 1e-6, true)), norm_names);
  EXPECT_EQ(parameter_names(*RMSNorm(8, 1e-6, false)), norm_names);
  const std::set<std::string> mlp_names{"gate_proj.weight", "up_proj.weight", "down_proj.weight"};
  EXPECT_EQ(parameter_names(*SwiGLUMLP(8, 16, true)), mlp_names);
  EXPECT_EQ(parameter_names(*SwiGLUMLP(8, 16, false)), mlp_names);
  SwiGLUMLP mlp(8, 16, false);
  EXPECT_EQ(mlp->gate_proj->weight.sizes(), torch::IntArrayRef({16, 8}));
  EXPECT_EQ(mlp->down_proj->weight.sizes(), torch::IntArrayRef({8, 16}));
}

TEST(ReferenceRMSNorm, MatchesTheFormulaInDoublePrecision) {
  torch::manual_seed(0);
  RMSNorm norm(7, 1e-5, false);
  torch::NoGradGuard no_grad;
  norm->weight.copy_(torch::randn({7}));
  const auto x = torch::randn({3, 5, 7});
  const auto xd = x.to(torch::kFloat64);
  const auto expected =
      xd / torch::sqrt(xd.pow(2).mean(-1, true) + 1e-5) * norm->weight.to(torch::kFloat64);
  EXPECT_TRUE(torch::allclose(norm(x).to(torch::kFloat64), expected, 1e-5, 1e-6));
}

TEST(ReferenceRMSNorm, ComputesStatisticsInFp32ForBf16Inputs) {
  torch::manual_seed(1);
  const auto x = (torch::randn({4, 64}) * 100).to(torch::kBFloat16);
  const auto w = torch::ones({64}, torch::kBFloat16);
  const auto y = ops::rms_norm_reference(x, w, 1e-6);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  // Unit-weight RMSNorm output has mean square 1 per row, whatever the input scale.
  const auto mean_square = y.to(torch::kFloat32).pow(2).mean(-1);
  EXPECT_TRUE(torch::allclose(mean_square, torch::ones({4}), 2e-2, 0));
}

TEST(ReferenceRMSNorm, ForwardAddReturnsTheSumAndItsNorm) {
  torch::manual_seed(2);
  RMSNorm norm(16, 1e-6, false);
  const auto x = torch::randn({3, 16});
  const auto residual = torch::randn({3, 16});
  auto [sum, normed] = norm->forward_add(x, residual);
  EXPECT_TRUE(torch::equal(sum, x + residual));
  EXPECT_TRUE(torch::allclose(normed, norm(x + residual)));
}

TEST(ReferenceSwiGLUMLP, MatchesDownOfSiluGateTimesUp) {
  torch::manual_seed(3);
  SwiGLUMLP mlp(8, 24, false);
  const auto x = torch::randn({2, 3, 8});
  const auto gate = torch::matmul(x, mlp->gate_proj->weight.t());
  const auto up = torch::matmul(x, mlp->up_proj->weight.t());
  const auto expected = torch::matmul(gate * torch::sigmoid(gate) * up, mlp->down_proj->weight.t());
  EXPECT_TRUE(torch::allclose(mlp(x), expected, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(ops::swiglu_reference(gate, up), gate * torch::sigmoid(gate) * up));
  const auto residual = torch::randn({2, 3, 8});
  EXPECT_TRUE(torch::equal(mlp->forward_add(x, residual), residual + mlp(x)));
}

TEST(FusedOps, RefuseCpuTensorsWithAClearMessage) {
  const auto x = torch::randn({2, 8});
  EXPECT_FALSE(ops::rms_norm_fusable(x, torch::ones({8})));
  EXPECT_FALSE(ops::swiglu_fusable(x, x));
  EXPECT_NE(error_of([&] { ops::rms_norm_fused(x, torch::ones({8}), 1e-6); }).find("CUDA"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::swiglu_fused(x, x); }).find("CUDA"), std::string::npos);
  const auto weight = torch::randn({3, 4});
  EXPECT_FALSE(ops::swiglu_down_fusable(x, weight));
  const std::string down = error_of([&] { ops::swiglu_down_fused(x, weight); });
  EXPECT_NE(down.find("CUDA"), std::string::npos) << down;
  EXPECT_NE(down.find("gate_up [2, 8] Float on cpu, weight [3, 4] Float on cpu, residual none"),
            std::string::npos)
      << down;
  const auto residual = torch::randn({2, 3});
  EXPECT_FALSE(ops::swiglu_down_fusable(x, weight, residual));
  const std::string down_add = error_of([&] { ops::swiglu_down_fused(x, weight, residual); });
  EXPECT_NE(down_add.find("residual [2, 3] Float on cpu"), std::string::npos) << down_add;
  // The whole-MLP node names every operand's shape.
  const auto h = torch::randn({2, 4});
  EXPECT_FALSE(ops::swiglu_mlp_fusable(h, torch::randn({6, 4}), weight.t(), h));
  const std::string mlp =
      error_of([&] { ops::swiglu_mlp_fused(h, torch::randn({6, 4}), weight.t(), h); });
  EXPECT_NE(mlp.find("x [2, 4], gate/up [6, 4], down [4, 3], residual [2, 4]"), std::string::npos)
      << mlp;
}

}  // namespace
}  // namespace dspine::model
