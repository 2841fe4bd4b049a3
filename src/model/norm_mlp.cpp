#include "model/norm_mlp.h"

#include <torch/torch.h>

#include "core/error.h"
#include "ops/adjacent_rows.h"
#include "ops/rms_norm_ops.h"
#include "ops/swiglu_ops.h"

namespace dspine::model {
namespace {

void require_cuda(const torch::Tensor& x, const char* module) {
  if (!x.is_cuda()) {
    fail(
        "{} was built with fused kernels but got an input on {}; fused kernels need CUDA "
        "(model.fused_kernels=auto picks the reference on CPU)",
        module, x.device().str());
  }
}

}  // namespace

bool use_fused_kernels(core::FusedKernels choice, const torch::Device& device) {
  using core::FusedKernels;
  switch (choice) {
    case FusedKernels::kOff:
      return false;
    case FusedKernels::kAuto:
      return device.is_cuda();
    case FusedKernels::kOn:
      if (!device.is_cuda()) {
        fail(
            "model.fused_kernels=true needs a CUDA device, but the model runs on {}; "
            "use auto or false without CUDA",
            device.str());
      }
      return true;
  }
  fail("model.fused_kernels: unknown choice");
}

RMSNormImpl::RMSNormImpl(int64_t hidden_size, double eps, bool fused)
    : weight(register_parameter("weight", torch::ones({hidden_size}))), eps(eps), fused(fused) {}

// Inputs the kernels do not take (fp64, a weight of another dtype) use the reference, which
// computes the same function.
torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  if (!fused) return ops::rms_norm_reference(x, weight, eps);
  require_cuda(x, "RMSNorm");
  if (!ops::rms_norm_fusable(x, weight)) return ops::rms_norm_reference(x, weight, eps);
  return ops::rms_norm_fused(x, weight, eps);
}

std::pair<torch::Tensor, torch::Tensor> RMSNormImpl::forward_add(const torch::Tensor& x,
                                                                 const torch::Tensor& residual) {
  if (!fused) return ops::add_rms_norm_reference(x, residual, weight, eps);
  require_cuda(x, "RMSNorm");
  if (!ops::rms_norm_fusable(x, weight) || residual.sizes() != x.sizes() ||
      residual.scalar_type() != x.scalar_type()) {
    return ops::add_rms_norm_reference(x, residual, weight, eps);
  }
  return ops::add_rms_norm_fused(x, residual, weight, eps);
}

std::pair<torch::Tensor, torch::Tensor> RMSNormImpl::forward_residual(const torch::Tensor& x) {
  if (!fused) return {x, ops::rms_norm_reference(x, weight, eps)};
  require_cuda(x, "RMSNorm");
  if (!ops::rms_norm_fusable(x, weight)) return {x, ops::rms_norm_reference(x, weight, eps)};
  return ops::rms_norm_residual_fused(x, weight, eps);
}

SwiGLUMLPImpl::SwiGLUMLPImpl(int64_t hidden_size, int64_t intermediate_size, bool fused)
    : fused(fused) {
  auto linear = [](int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
  };
  gate_proj = register_module("gate_proj", linear(hidden_size, intermediate_size));
  up_proj = register_module("up_proj", linear(hidden_size, intermediate_size));
  down_proj = register_module("down_proj", linear(intermediate_size, hidden_size));
}

torch::Tensor SwiGLUMLPImpl::forward(const torch::Tensor& x) { return project(x, {}); }

torch::Tensor SwiGLUMLPImpl::forward_add(const torch::Tensor& x, const torch::Tensor& residual) {
  return project(x, residual);
}

torch::Tensor SwiGLUMLPImpl::project(const torch::Tensor& x, const torch::Tensor& residual) {
  const auto plus_residual = [&](const torch::Tensor& y) {
    return residual.defined() ? residual + y : y;
  };
  if (!fused) return plus_residual(down_proj(ops::swiglu_reference(gate_proj(x), up_proj(x))));
  require_cuda(x, "SwiGLUMLP");
  // One GEMM for gate and up: their weights are adjacent rows of the layer's sharding unit, so
  // the packed weight is a view (a copy only when they are not).
  const torch::Tensor gate_up =
      torch::nn::functional::linear(x, ops::adjacent_rows(gate_proj->weight, up_proj->weight));
  if (!ops::swiglu_fusable(gate_up, gate_up)) {
    const auto halves = gate_up.chunk(2, -1);
    return plus_residual(down_proj(ops::swiglu_reference(halves[0], halves[1])));
  }
  // The activation and the down projection as one node that recomputes the activation in its
  // backward rather than keeping it (docs/kernels.md, "RMSNorm and SwiGLU"); the residual is
  // added in the down GEMM's epilogue (docs/kernels.md, "GEMM").
  if (ops::swiglu_down_fusable(gate_up, down_proj->weight, residual)) {
    return ops::swiglu_down_fused(gate_up, down_proj->weight, residual);
  }
  return plus_residual(down_proj(ops::swiglu_packed_fused(gate_up)));
}

}  // namespace dspine::model
