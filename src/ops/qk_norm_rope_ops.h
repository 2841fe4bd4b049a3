// The draft attention's per-head q/k RMSNorm followed by RoPE as tensor operations
// (docs/kernels.md, "Query/key norm and RoPE"): the ATen reference (the oracle, and the path for
// inputs the kernels do not take) and the fused CUDA kernels (src/kernels/qk_norm_rope.h) as an
// autograd function.
#pragma once

#include <ATen/core/Tensor.h>

namespace dspine::ops {

// x [B, P, heads, D] rotated by the LAST P positions of cos/sin [B, P' >= P, D]:
// x ⊙ cos + rotate_half(x) ⊙ sin with rotate_half(x) = [−x[..., D/2:], x[..., :D/2]].
at::Tensor rope_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// rope_reference(rms_norm_reference(x, weight, eps), cos, sin): the unfused composition.
at::Tensor qk_norm_rope_reference(const at::Tensor& x, const at::Tensor& weight, double eps,
                                  const at::Tensor& cos, const at::Tensor& sin);

// Whether the fused kernels take these inputs: CUDA fp32/fp16/bf16 x [B, P, heads, D] with D 64
// or 128, weight [D] and cos/sin [B, P' >= P, D] of x's dtype on x's device, tables without grad.
bool qk_norm_rope_fusable(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos,
                          const at::Tensor& sin);

// qk_norm_rope_reference by the fused kernels, fp32 inside and rounded once; gradients flow to x
// and weight (dweight reduced in a fixed order). Throws dspine::Error naming the shapes, dtypes
// and devices when !qk_norm_rope_fusable.
at::Tensor qk_norm_rope(const at::Tensor& x, const at::Tensor& weight, double eps,
                        const at::Tensor& cos, const at::Tensor& sin);

}  // namespace dspine::ops
