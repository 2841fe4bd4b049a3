// RMSNorm as tensor operations: the ATen reference (the oracle) and the fused CUDA kernels wrapped
// as autograd functions (src/kernels/rms_norm.h). Inputs are [..., hidden]; weight is [hidden].
#pragma once

#include <utility>

#include <ATen/core/Tensor.h>

namespace dspine::ops {

// weight * (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype): the Hugging Face Qwen3 formula.
at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& weight, double eps);

// {x + residual, rms_norm_reference(x + residual)}: the decoder layer's add-then-norm.
std::pair<at::Tensor, at::Tensor> add_rms_norm_reference(const at::Tensor& x,
                                                         const at::Tensor& residual,
                                                         const at::Tensor& weight, double eps);

// Whether the fused kernels take these inputs: CUDA, fp32/fp16/bf16, a weight [H] of x's dtype.
bool rms_norm_fusable(const at::Tensor& x, const at::Tensor& weight);

// The fused kernels with autograd (dx and dweight; dweight reduced deterministically). Throws
// dspine::Error naming the shape/dtype/device when !rms_norm_fusable.
at::Tensor rms_norm_fused(const at::Tensor& x, const at::Tensor& weight, double eps);
std::pair<at::Tensor, at::Tensor> add_rms_norm_fused(const at::Tensor& x,
                                                     const at::Tensor& residual,
                                                     const at::Tensor& weight, double eps);
// {x (a view), norm(x)} as one node, for an x used both as a residual and normed: the backward
// gives d(view) + d(norm) from the norm's kernel, where autograd would add the two in a pass.
std::pair<at::Tensor, at::Tensor> rms_norm_residual_fused(const at::Tensor& x,
                                                          const at::Tensor& weight, double eps);

}  // namespace dspine::ops
