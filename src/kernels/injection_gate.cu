#include "kernels/injection_gate.h"

#include "kernels/norm_swiglu_common.cuh"

namespace dspine::kernels {
namespace {

using detail::block_sum;
using detail::from_float;
using detail::to_float;

constexpr int kThreads = 128;  // four warps: a row holds a few hundred elements

// Σ x² over n elements of a row, every thread of the block getting the sum.
template <typename T>
__device__ float row_squares(const T* row, int64_t n, float* scratch) {
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = to_float(row[i]);
    sum += v * v;
  }
  return block_sum(sum, scratch);
}

// One block per row of y (slot t of block b).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    injection_gate_kernel(const T* __restrict__ y, const T* __restrict__ h,
                          const T* __restrict__ anchor_table,
                          const int64_t* __restrict__ anchor_ids, int64_t id_stride,
                          const T* __restrict__ bias, T* __restrict__ out, InjectionGateShape s) {
  __shared__ float scratch[kThreads / 32];
  const int64_t row = blockIdx.x;
  const int64_t slot = row % s.slots;
  const int64_t m = s.message;
  T* out_row = out + row * m;
  if (slot == 0) {  // the same branch for the whole block: no barrier is skipped by part of it
    for (int64_t j = threadIdx.x; j < m; j += blockDim.x) out_row[j] = from_float<T>(0.0f);
    return;
  }
  const int64_t width = s.rank + 3 * m;
  const T* own = y + row * width;
  const float own_scale = rsqrtf(row_squares(own, s.rank, scratch) / s.rank + s.eps);
  const float rms = sqrtf(row_squares(h + row * s.hidden, s.hidden, scratch) / s.hidden);
  // The predecessor's gate and message terms: the previous slot's (scaled by its feature norm),
  // or the anchor's from the table.
  const T* pred;
  float pred_scale = 1.0f;
  if (slot >= 2) {
    const T* previous = own - width;
    pred_scale = rsqrtf(row_squares(previous, s.rank, scratch) / s.rank + s.eps);
    pred = previous + s.rank + m;
  } else {
    pred = anchor_table + anchor_ids[row / s.slots * id_stride] * 2 * m;
  }
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
    const float logit =
        own_scale * to_float(own[s.rank + j]) + to_float(bias[j]) + pred_scale * to_float(pred[j]);
    const float gate = 1.0f / (1.0f + __expf(-logit));
    out_row[j] = from_float<T>(rms * gate * pred_scale * to_float(pred[m + j]));
  }
}

}  // namespace

bool injection_gate_supported(const InjectionGateShape& s) {
  return s.rows > 0 && s.slots >= 2 && s.rows % s.slots == 0 && s.rank > 0 && s.message > 0 &&
         s.hidden > 0 && s.eps >= 0.0f;
}

cudaError_t injection_gate_forward(const void* y, const void* h, const void* anchor_table,
                                   const int64_t* anchor_ids, int64_t id_stride, const void* bias,
                                   void* out, const InjectionGateShape& shape,
                                   cudaStream_t stream) {
  if (!injection_gate_supported(shape)) return cudaErrorInvalidValue;
  return detail::dispatch_dtype(shape.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    injection_gate_kernel<T><<<static_cast<unsigned>(shape.rows), kThreads, 0, stream>>>(
        static_cast<const T*>(y), static_cast<const T*>(h), static_cast<const T*>(anchor_table),
        anchor_ids, id_stride, static_cast<const T*>(bias), static_cast<T*>(out), shape);
    return cudaGetLastError();
  });
}

}  // namespace dspine::kernels
