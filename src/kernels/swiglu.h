// SwiGLU activation out = silu(gate) * up on raw device pointers, computed in fp32.
// Tensors are [rows, cols] with a row stride each (elements), so gate and up may be the two
// halves of one fused gate_up projection output ([rows, 2 * cols]). 128-bit accesses are used
// when every row start is 16-byte aligned. Launches are asynchronous on `stream` and return the
// launch error (cudaSuccess when queued).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/norm_swiglu_types.h"

namespace dspine::kernels {

struct Strided2d {
  int64_t rows = 0;
  int64_t cols = 0;
};

cudaError_t swiglu_forward(const void* gate, int64_t gate_stride, const void* up, int64_t up_stride,
                           void* out, int64_t out_stride, Strided2d shape, DType dtype,
                           cudaStream_t stream);

// Recomputes silu(gate) in fp32 from gate and up (nothing is saved by the forward):
// dgate = dout * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate))), dup = dout * silu(gate).
cudaError_t swiglu_backward(const void* dout, int64_t dout_stride, const void* gate,
                            int64_t gate_stride, const void* up, int64_t up_stride, void* dgate,
                            int64_t dgate_stride, void* dup, int64_t dup_stride, Strided2d shape,
                            DType dtype, cudaStream_t stream);

// swiglu_backward, with dout then overwritten by the activation silu(gate) * up, bit for bit what
// swiglu_forward writes: a backward that saved gate and up but not the activation gets both the
// activation's gradient and the activation itself (for the next GEMM's weight gradient) from one
// pass, in the memory dout already holds.
cudaError_t swiglu_backward_recompute(void* dout_act, int64_t dout_act_stride, const void* gate,
                                      int64_t gate_stride, const void* up, int64_t up_stride,
                                      void* dgate, int64_t dgate_stride, void* dup,
                                      int64_t dup_stride, Strided2d shape, DType dtype,
                                      cudaStream_t stream);

}  // namespace dspine::kernels
