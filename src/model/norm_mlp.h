// The kernel factory (docs/model.md, "Backbone layers"): RMSNorm and SwiGLU MLP modules built
// either as reference ATen modules or as fused CUDA autograd functions. Parameter names are
// identical either way (`weight`; `gate_proj.weight`, `up_proj.weight`, `down_proj.weight`), so
// checkpoints interoperate; nothing global is patched.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include <string>
#include <utility>

#include "core/config.h"

namespace dspine::model {

// Whether fused kernels are used on `device` for model.fused_kernels; true without CUDA throws.
bool use_fused_kernels(core::FusedKernels choice, const torch::Device& device);

// y = x * rsqrt(mean(x^2) + eps) * weight, statistics in fp32, output in x's dtype.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t hidden_size, double eps, bool fused);
  torch::Tensor forward(const torch::Tensor& x);
  // The decoder layer's add-then-norm: returns {x + residual, norm(x + residual)}, one kernel
  // when fused.
  std::pair<torch::Tensor, torch::Tensor> forward_add(const torch::Tensor& x,
                                                      const torch::Tensor& residual);
  // {x, norm(x)} for an x that is also the residual: fused, both come from one autograd node
  // whose backward adds the residual's gradient inside the norm's kernel (no separate sum).
  std::pair<torch::Tensor, torch::Tensor> forward_residual(const torch::Tensor& x);
  torch::Tensor weight;
  double eps;
  bool fused;
};
TORCH_MODULE(RMSNorm);

// down_proj(silu(gate_proj(x)) * up_proj(x)); projections without bias. Fused, gate and up run
// as one GEMM on the concatenated weights (the checkpoint keeps gate_proj / up_proj separate).
class SwiGLUMLPImpl : public torch::nn::Module {
 public:
  SwiGLUMLPImpl(int64_t hidden_size, int64_t intermediate_size, bool fused);
  torch::Tensor forward(const torch::Tensor& x);
  // The decoder layer's residual + forward(x); fused, the add happens in the down projection's
  // GEMM epilogue where the project's GEMM takes the operands.
  torch::Tensor forward_add(const torch::Tensor& x, const torch::Tensor& residual);
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  bool fused;

 private:
  torch::Tensor project(const torch::Tensor& x, const torch::Tensor& residual);
};
TORCH_MODULE(SwiGLUMLP);

}  // namespace dspine::model
