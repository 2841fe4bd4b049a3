// Fused RMSNorm (optionally preceded by a residual add) on raw device pointers.
// Rows are contiguous with `hidden` elements each (any hidden size: short rows take one warp,
// longer rows one block holding the row in registers, the longest two passes); statistics and
// accumulation are fp32; the per-row reciprocal RMS (rstd) is saved in fp32 for the backward pass.
// x, residual, weight and every output share one element type. Launches are asynchronous on
// `stream` and return the launch error (cudaSuccess when queued).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/norm_swiglu_types.h"

namespace dspine::kernels {

// y = x * rstd * weight with rstd = rsqrt(mean(x^2) + eps). When `residual` is non-null the
// normalised input is s = x + residual, rounded to the element type and written to `sum`
// (the decoder layer's new residual stream), and y = norm(s).
cudaError_t rms_norm_forward(const void* x, const void* residual, const void* weight, void* sum,
                             void* y, float* rstd, int64_t rows, int64_t hidden, float eps,
                             DType dtype, cudaStream_t stream);

// Bytes of fp32 scratch that rms_norm_backward needs for the weight-gradient partial sums.
size_t rms_norm_backward_workspace_bytes(int64_t rows, int64_t hidden, DType dtype);

// Gradients of y = norm(s) * weight, where s is `x` (the forward's input, or its `sum` output
// when a residual was added). dx = ds (+ dsum when non-null: the gradient arriving at the sum
// output, so dx serves as the gradient of both x and residual). dweight = sum over rows of
// dy * s * rstd, reduced deterministically: each block (or warp) writes its own partial row to
// `workspace`, and a second kernel sums them in a fixed order — no float atomics.
cudaError_t rms_norm_backward(const void* dy, const void* dsum, const void* x, const void* weight,
                              const float* rstd, void* dx, void* dweight, void* workspace,
                              int64_t rows, int64_t hidden, DType dtype, cudaStream_t stream);

}  // namespace dspine::kernels
