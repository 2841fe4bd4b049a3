// The adjacent injection's residual write as tensor operations (docs/kernels.md, "Injection
// residual"): out = h + rms(h) · delta with rms(h) = ‖h‖₂ / √H per row. h is [..., T, H]; delta
// is [..., T, H], or [..., T − 1, H] with `skip_first` (the first position of every block is
// left unchanged and gets no delta). The ATen reference is the oracle; the fused CUDA kernels
// (src/kernels/injection_residual.h) carry autograd for h and delta.
#pragma once

#include <ATen/core/Tensor.h>

namespace dspine::ops {

// rms accumulated in fp32 (fp64 for fp64 h; no widened copy of h), rounded to h's dtype, then
// h + rms·delta in h's dtype; with skip_first, cat(h[..., :1, :], that over h[..., 1:, :]).
at::Tensor injection_residual_reference(const at::Tensor& h, const at::Tensor& delta,
                                        bool skip_first);

// CUDA, fp32/fp16/bf16, delta of h's dtype and matching shape, and a row width the kernels take.
bool injection_residual_fusable(const at::Tensor& h, const at::Tensor& delta, bool skip_first);

// The fused kernels; throws dspine::Error naming the shapes when !injection_residual_fusable.
at::Tensor injection_residual_fused(const at::Tensor& h, const at::Tensor& delta,
                                    bool skip_first);

}  // namespace dspine::ops
