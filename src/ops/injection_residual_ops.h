// The adjacent injection's residual write as tensor operations (docs/kernels.md, "Injection
// residual"): out = h + rms(h) · delta with rms(h) = ‖h‖₂ / √H per row. h is [..., T, H]; delta
// is [..., T, H], or [..., T − 1, H] with `skip_first` (the first position of every block is
// left unchanged and gets no delta). The ATen reference is the oracle; the fused CUDA kernels
// (src/kernels/injection_residual.h) carry autograd for h and delta.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

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

// The residual write and the readout of what it wrote, at once: {out, out_r} with out as above and
// out_r = r + rms(h) · delta_r (r unchanged on skipped slots). When r = readout(h) and delta_r =
// readout(delta) for a linear readout, out_r = readout(out) up to rounding: the adjacent
// injection's layer features without a product over H (docs/model.md, "Adjacent injection and the
// transfer space"). r is [..., T, R]; delta_r pairs with r as delta with h.
std::pair<at::Tensor, at::Tensor> injection_residual_readout_reference(const at::Tensor& h,
                                                                       const at::Tensor& delta,
                                                                       const at::Tensor& r,
                                                                       const at::Tensor& delta_r,
                                                                       bool skip_first);

// injection_residual_fusable(h, delta) with r and delta_r of h's dtype and device, paired alike,
// r's rows h's and of 16-byte packs.
bool injection_residual_readout_fusable(const at::Tensor& h, const at::Tensor& delta,
                                        const at::Tensor& r, const at::Tensor& delta_r,
                                        bool skip_first);

// Both by the fused kernels, each row's rms in fp32 and each sum rounded once, one autograd node:
// the readout's derivative by rms joins the write's in the kernel's backward, so h's gradient is
// one pass. Throws dspine::Error naming the shapes when not fusable.
std::pair<at::Tensor, at::Tensor> injection_residual_readout_fused(const at::Tensor& h,
                                                                   const at::Tensor& delta,
                                                                   const at::Tensor& r,
                                                                   const at::Tensor& delta_r,
                                                                   bool skip_first);

}  // namespace dspine::ops
