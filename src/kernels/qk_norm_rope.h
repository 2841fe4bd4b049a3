// Per-head RMSNorm followed by the rotary embedding, fused (docs/kernels.md, "Query/key norm and
// RoPE"): the draft attention's q_norm/k_norm + apply_rope as one read and one write of q or k in
// each direction. Raw device pointers, no framework headers; statistics and arithmetic in fp32,
// rounded once at the output. Launches are asynchronous on `stream` and return the launch error.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/norm_swiglu_types.h"

namespace dspine::kernels {

// x holds B·P rows (row b·P + p is position p of batch row b) of `heads` vectors of head_dim
// elements each; a row's vectors are contiguous, rows are x_row_stride elements apart. Outputs
// and gradients are contiguous [B·P, heads, head_dim].
struct QkNormRopeShape {
  int64_t batch = 0;
  int64_t positions = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t x_row_stride = 0;
};

// cos/sin [B, P, head_dim] views, already offset to the first position used, with the given
// element strides (head_dim contiguous); both tables share the strides.
struct RopeTableView {
  const void* cos = nullptr;
  const void* sin = nullptr;
  int64_t batch_stride = 0;
  int64_t position_stride = 0;
};

// Whether the kernels take this shape: head_dim 64 or 128, fewer than 2^31 vectors, x's row
// stride a multiple of 16 bytes. Launches also need 16-byte aligned pointers and table strides
// (else cudaErrorInvalidValue).
bool qk_norm_rope_supported(const QkNormRopeShape& shape, DType dtype);

// out = y ⊙ cos + rotate_half(y) ⊙ sin with y = weight ⊙ x · rstd, rstd = rsqrt(mean(x²) + eps)
// per vector, saved in fp32 [B·P·heads]. weight [head_dim] has x's element type.
cudaError_t qk_norm_rope_forward(const QkNormRopeShape& shape, const void* x, const void* weight,
                                 const RopeTableView& rope, float eps, void* out, float* rstd,
                                 DType dtype, cudaStream_t stream);

// Rows of the fp32 [ctas, head_dim] weight-gradient partials qk_norm_rope_backward writes: one
// per CTA of its persistent grid. The caller sums them (a fixed order, hence deterministic).
int64_t qk_norm_rope_backward_ctas(const QkNormRopeShape& shape);

// dx from grad_out (contiguous) and the forward's x, weight and rstd; the CTA partials of dweight
// to dweight_partials [qk_norm_rope_backward_ctas(shape), head_dim]. No float atomics.
cudaError_t qk_norm_rope_backward(const QkNormRopeShape& shape, const void* grad_out, const void* x,
                                  const void* weight, const float* rstd, const RopeTableView& rope,
                                  void* dx, float* dweight_partials, DType dtype,
                                  cudaStream_t stream);

}  // namespace dspine::kernels
