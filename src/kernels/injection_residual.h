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

// out [rows, H]; rms [rows] fp32 (0 on skipped rows), saved for the backward.
cudaError_t injection_residual_forward(const void* h, const void* delta, void* out, float* rms,
                                       const InjectionRows& shape, cudaStream_t stream);

// dh = g + (Σ g·delta + e) · h / (H · rms) (g alone on skipped rows and where rms = 0);
// ddelta = rms · g. e = extra_dot[row] is the derivative by rms from its other uses (the readout
// of the output, ops::injection_residual_readout_fused); extra_dot may be null (e = 0).
cudaError_t injection_residual_backward(const void* grad, const void* h, const void* delta,
                                        const float* rms, const float* extra_dot, void* grad_h,
                                        void* grad_delta, const InjectionRows& shape,
                                        cudaStream_t stream);

}  // namespace dspine::kernels
