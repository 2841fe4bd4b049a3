#include "kernels/candidate_scores.h"

#include <cuda_bf16.h>

#include <type_traits>

#include "kernels/norm_swiglu_common.cuh"

namespace dspine::kernels {
namespace {

using bf16 = __nv_bfloat16;
using detail::load_floats;
using detail::store_floats;

constexpr int kThreads = 128;  // one row per block: 4 warps, 8 elements (16 bytes) per load
constexpr int kWarps = kThreads / 32;
constexpr int kPack = 8;
constexpr int kMaxK = 32;

// The block's candidates: row pointers into the table (null for an id out of range).
__device__ __forceinline__ void load_candidates(const bf16* table, const int64_t* ids,
                                                const CandidateRows& shape,
                                                const bf16* (&rows)[kMaxK]) {
  const int64_t n = blockIdx.x;
  if (threadIdx.x < shape.k) {
    const int64_t id = ids[n * shape.k + threadIdx.x];
    rows[threadIdx.x] = id >= 0 && id < shape.vocab ? table + id * shape.hidden : nullptr;
  }
  __syncthreads();
}

// kK ≥ k bounds the unrolled candidate loops (the loads of one pack of every candidate are in
// flight together); candidates j ≥ k are skipped.
template <int kK>
__global__ void __launch_bounds__(kThreads)
    candidate_scores_forward_kernel(const bf16* __restrict__ table,
                                    const int64_t* __restrict__ ids, const bf16* __restrict__ x,
                                    float* __restrict__ scores, CandidateRows shape) {
  __shared__ const bf16* rows[kMaxK];
  __shared__ float partial[kK][kWarps];
  load_candidates(table, ids, shape, rows);
  const int64_t n = blockIdx.x;
  const bf16* xr = x + n * shape.hidden;
  float acc[kK];
#pragma unroll
  for (int j = 0; j < kK; ++j) acc[j] = 0.0f;
  for (int64_t p = int64_t(threadIdx.x) * kPack; p < shape.hidden; p += kThreads * kPack) {
    float xv[kPack];
    load_floats(xr + p, xv);
#pragma unroll
    for (int j = 0; j < kK; ++j) {
      if (j < shape.k && rows[j] != nullptr) {
        float tv[kPack];
        load_floats(rows[j] + p, tv);
#pragma unroll
        for (int i = 0; i < kPack; ++i) acc[j] = fmaf(tv[i], xv[i], acc[j]);
      }
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    const float s = detail::warp_sum(acc[j]);
    if (lane == 0) partial[j][warp] = s;
  }
  __syncthreads();
  if (threadIdx.x < shape.k) {
    const int j = threadIdx.x;
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += partial[j][w];
    scores[n * shape.k + j] = rows[j] != nullptr ? s : __int_as_float(0x7fc00000);
  }
}

template <int kK>
__global__ void __launch_bounds__(kThreads)
    candidate_scores_backward_kernel(const float* __restrict__ grad_scores,
                                     const bf16* __restrict__ table,
                                     const int64_t* __restrict__ ids, bf16* __restrict__ grad_x,
                                     CandidateRows shape) {
  __shared__ const bf16* rows[kMaxK];
  __shared__ float grads[kMaxK];
  const int64_t n = blockIdx.x;
  if (threadIdx.x < shape.k) grads[threadIdx.x] = grad_scores[n * shape.k + threadIdx.x];
  load_candidates(table, ids, shape, rows);
  bf16* gx = grad_x + n * shape.hidden;
  for (int64_t p = int64_t(threadIdx.x) * kPack; p < shape.hidden; p += kThreads * kPack) {
    float acc[kPack] = {};
#pragma unroll
    for (int j = 0; j < kK; ++j) {
      if (j < shape.k && rows[j] != nullptr) {
        float tv[kPack];
        load_floats(rows[j] + p, tv);
        const float g = grads[j];
#pragma unroll
        for (int i = 0; i < kPack; ++i) acc[i] = fmaf(g, tv[i], acc[i]);
      }
    }
    store_floats(gx + p, acc);
  }
}

// Calls launch(integral_constant<kK>) for the smallest of 4, 8, 16, 32 that holds k.
template <typename Launch>
cudaError_t with_bound(int64_t k, Launch&& launch) {
  if (k <= 4) {
    launch(std::integral_constant<int, 4>{});
  } else if (k <= 8) {
    launch(std::integral_constant<int, 8>{});
  } else if (k <= 16) {
    launch(std::integral_constant<int, 16>{});
  } else {
    launch(std::integral_constant<int, 32>{});
  }
  return cudaGetLastError();
}

}  // namespace

bool candidate_scores_supported(int64_t k, int64_t hidden) {
  return k >= 1 && k <= kMaxK && hidden > 0 && hidden % kPack == 0;
}

cudaError_t candidate_scores_forward(const void* table, const int64_t* ids, const void* x,
                                     float* scores, const CandidateRows& shape,
                                     cudaStream_t stream) {
  if (!candidate_scores_supported(shape.k, shape.hidden)) return cudaErrorInvalidValue;
  if (shape.rows == 0) return cudaSuccess;
  return with_bound(shape.k, [&](auto bound) {
    candidate_scores_forward_kernel<decltype(bound)::value>
        <<<unsigned(shape.rows), kThreads, 0, stream>>>(static_cast<const bf16*>(table), ids,
                                                         static_cast<const bf16*>(x), scores,
                                                         shape);
  });
}

cudaError_t candidate_scores_backward(const float* grad_scores, const void* table,
                                      const int64_t* ids, void* grad_x, const CandidateRows& shape,
                                      cudaStream_t stream) {
  if (!candidate_scores_supported(shape.k, shape.hidden)) return cudaErrorInvalidValue;
  if (shape.rows == 0) return cudaSuccess;
  return with_bound(shape.k, [&](auto bound) {
    candidate_scores_backward_kernel<decltype(bound)::value>
        <<<unsigned(shape.rows), kThreads, 0, stream>>>(
            grad_scores, static_cast<const bf16*>(table), ids, static_cast<bf16*>(grad_x), shape);
  });
}

}  // namespace dspine::kernels
