// The DSpine alignment term's cosine between each layer's feature rows and the labels' transfer
// codes (docs/model.md, "Objective"), as an autograd function over kernels/cosine_alignment and
// as the ATen reference it is tested against.
#pragma once

#include <ATen/core/Tensor.h>

namespace dspine::ops {

// features [c, L, T, r] (fp32 or bf16, differentiable), codes [c, T, r] fp32 (no gradient):
// cos [c, L, T] fp32 of each feature row with its position's code, norms clamped at eps.
at::Tensor cosine_alignment_reference(const at::Tensor& features, const at::Tensor& codes,
                                      double eps);

// Whether the kernels take these tensors (CUDA, r a multiple of 8, rows contiguous).
bool cosine_alignment_fusable(const at::Tensor& features, const at::Tensor& codes);

// The same function through the kernels; the gradient reaches `features` only.
at::Tensor cosine_alignment_fused(const at::Tensor& features, const at::Tensor& codes, double eps);

}  // namespace dspine::ops
