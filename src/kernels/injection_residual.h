// The adjacent injection's residual write, out = h + rms(h) · delta, on raw device pointers
// (docs/kernels.md, "Injection residual"). rms(h) = ‖h‖ / √H is taken per row in fp32 and the sum
// is rounded once. Rows are grouped in blocks of `positions`; with `skip_first` the first row of
// every block is copied unchanged and delta holds positions − 1 rows per block (the proposals),
// so neither the caller's slice of h nor a concatenation is materialised.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/norm_swiglu_types.h"

namespace dspine::kernels {

struct InjectionRows {
  int64_t rows = 0;       // rows of h (a multiple of positions)
  int64_t hidden = 0;     // H; h, delta and out rows are contiguous
  int64_t positions = 1;  // rows per block
  bool skip_first = false;
  DType type = DType::kBFloat16;
};

// Whether the kernels take rows of `hidden` elements of `type` (16-byte packs, ≤ 8 per thread).
bool injection_residual_supported(int64_t hidden, DType type);

// Optional rows of width R beside h's, one per row of h and of delta alike: the readout of the
// write (ops::injection_residual_readout_fused). Forward: out_r = r + rms · delta_r (r copied on
// skipped rows). Backward: with grad_r, Σ grad_r · delta_r joins Σ g · delta as the derivative
// by rms, and grad_delta_r = rms · grad_r (r's gradient is grad_r itself).
struct InjectionReadout {
  int64_t width = 0;  // R; rows contiguous, 16-byte packs
  const void* r = nullptr;
  const void* delta_r = nullptr;
  void* out_r = nullptr;
  const void* grad_r = nullptr;  // null: the readout took no gradient
  void* grad_delta_r = nullptr;
};

// Whether the kernels take readout rows of `width` elements of `type`.
bool injection_readout_supported(int64_t width, DType type);

// out [rows, H]; rms [rows] fp32 (0 on skipped rows), saved for the backward.
cudaError_t injection_residual_forward(const void* h, const void* delta, void* out, float* rms,
                                       const InjectionRows& shape, cudaStream_t stream,
                                       const InjectionReadout* readout = nullptr);

// dh = g + (Σ g·delta) · h / (H · rms) (g alone on skipped rows and where rms = 0);
// ddelta = rms · g; with a readout, as above.
cudaError_t injection_residual_backward(const void* grad, const void* h, const void* delta,
                                        const float* rms, void* grad_h, void* grad_delta,
                                        const InjectionRows& shape, cudaStream_t stream,
                                        const InjectionReadout* readout = nullptr);

}  // namespace dspine::kernels
