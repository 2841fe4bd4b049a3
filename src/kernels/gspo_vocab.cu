// Monolithic GSPO vocab kernels: see gspo_vocab.h. Memory-bound streaming over the logits, one
// block per row. Each thread keeps kUnroll raw 16-byte packets in flight (raw bf16 words are half
// the registers of their floats, so more bytes stay in flight per SM) and works in the base-2
// domain: y = z·λ·log2(e), so every exponential is one ex2 instruction. The forward reduces a
// whole iteration's packets to one (max, sum) update: max pass, one rescale, sum pass. The
// backward forms λ·z − lse in the natural base (one fused multiply-add) before its ex2.
#include "kernels/gspo_vocab.h"

#include <cuda_bf16.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/gspo_seam_kernels.h"
#include "kernels/norm_swiglu_common.cuh"

namespace dspine::kernels {
namespace {

using detail::from_float;
using detail::to_float;

constexpr int kThreads = 256;
// Blocks per SM the register budgets are sized for: 64 registers a thread in the forward, 80 in
// the backward (which also holds the output, and the old gradient when accumulating).
constexpr int kForwardMinBlocks = 4;
constexpr int kBackwardMinBlocks = 3;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 2^x by the special-function unit (relative error ~2^-22; −inf → 0).
__device__ __forceinline__ float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// kWidth consecutive elements of T: one 16-byte packet (kWidth·sizeof(T) = 16) or one element.
template <typename T, int kWidth>
struct Packet {
  static_assert(kWidth * sizeof(T) == 16, "vector packets are 16 bytes");
  uint4 raw;
  __device__ __forceinline__ void load(const T* p) { raw = __ldg(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ void load_streaming(const T* p) {
    raw = __ldcs(reinterpret_cast<const uint4*>(p));
  }
  __device__ __forceinline__ unsigned word(int i) const {
    return i == 0 ? raw.x : i == 1 ? raw.y : i == 2 ? raw.z : raw.w;
  }
  // Element e as float; e must be a compile-time constant after unrolling.
  __device__ __forceinline__ float at(int e) const {
    if constexpr (std::is_same_v<T, float>) {
      return __uint_as_float(word(e));
    } else {
      const unsigned w = word(e / 2);
      return __uint_as_float(e % 2 == 0 ? w << 16 : w & 0xffff0000u);
    }
  }
  __device__ __forceinline__ static void store(T* p, const float (&in)[kWidth]) {
    unsigned words[4];
    if constexpr (std::is_same_v<T, float>) {
#pragma unroll
      for (int i = 0; i < 4; ++i) words[i] = __float_as_uint(in[i]);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
        memcpy(&words[i], &pair, sizeof(unsigned));
      }
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(words[0], words[1], words[2], words[3]);
  }
};

// Scalar packets (rows not 16-byte aligned): one element, converted on load.
template <typename T>
struct Packet<T, 1> {
  float value;
  __device__ __forceinline__ void load(const T* p) { value = to_float(*p); }
  __device__ __forceinline__ void load_streaming(const T* p) { value = to_float(*p); }
  __device__ __forceinline__ float at(int) const { return value; }
  __device__ __forceinline__ static void store(T* p, const float (&in)[1]) { *p = from_float<T>(in[0]); }
};

// Merges the partial statistics (m2, s2) into (m, s), base 2: s counts 2^(y − m).
__device__ __forceinline__ void merge_stats(float& m, float& s, float m2, float s2) {
  const float top = fmaxf(m, m2);
  if (top == -INFINITY) return;  // both empty (or all −inf)
  s = s * exp2_fast(m - top) + s2 * exp2_fast(m2 - top);
  m = top;
}

template <typename T, int kWidth>
__global__ void __launch_bounds__(kThreads, kForwardMinBlocks)
    vocab_forward_kernel(GspoLogits logits, const int64_t* target, float scale, float* logprobs,
                         float* lse, int* status) {
  constexpr int kUnroll = 8;
  const int64_t row = blockIdx.x;
  const int64_t y = target[row];
  if (y < 0 || y >= logits.vocab) {
    if (threadIdx.x == 0) {
      if (y >= logits.vocab) atomicOr(status, kGspoBadTarget);
      logprobs[row] = 0.f;
      lse[row] = 0.f;
    }
    return;
  }
  const float k = scale * kLog2e;
  const T* p = static_cast<const T*>(logits.data) + row * logits.row_stride;
  const int64_t vectors = logits.vocab / kWidth;
  float m = -INFINITY, s = 0.f;
  for (int64_t j = threadIdx.x; j < vectors; j += int64_t(kThreads) * kUnroll) {
    Packet<T, kWidth> x[kUnroll];
    bool valid[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = j + int64_t(u) * kThreads;
      valid[u] = v < vectors;
      if (valid[u]) x[u].load(p + v * kWidth);
    }
    float top = m;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int e = 0; e < kWidth; ++e)
        if (valid[u]) top = fmaxf(top, x[u].at(e) * k);
    if (top == -INFINITY) continue;
    s *= exp2_fast(m - top);
    m = top;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int e = 0; e < kWidth; ++e)
        if (valid[u]) s += exp2_fast(x[u].at(e) * k - m);
  }
  for (int64_t j = vectors * kWidth + threadIdx.x; j < logits.vocab; j += kThreads)
    merge_stats(m, s, to_float(p[j]) * k, 1.f);

  // Block reduction of (m, s) in a fixed tree: warps by shuffle, then warp 0 over the warps.
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    merge_stats(m, s, __shfl_xor_sync(0xffffffffu, m, offset),
                __shfl_xor_sync(0xffffffffu, s, offset));
  __shared__ float warp_m[kThreads / 32], warp_s[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_m[warp] = m;
    warp_s[warp] = s;
  }
  __syncthreads();
  if (warp != 0) return;
  m = lane < kThreads / 32 ? warp_m[lane] : -INFINITY;
  s = lane < kThreads / 32 ? warp_s[lane] : 0.f;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    merge_stats(m, s, __shfl_xor_sync(0xffffffffu, m, offset),
                __shfl_xor_sync(0xffffffffu, s, offset));
  if (lane == 0) {
    // m is the reference point the terms were formed against (each by one fused multiply-add),
    // so only this sum and the scaling round: in double, once per row.
    const float row_lse = static_cast<float>((double(m) + log2(double(s))) * double(kLn2));
    lse[row] = row_lse;
    logprobs[row] = to_float(p[y]) * scale - row_lse;
  }
}

// Rows run in reverse order of the forward's, so the first rows read here are the ones the
// forward read last (possibly still in L2).
template <typename T, int kWidth, bool kAccumulate>
__global__ void __launch_bounds__(kThreads, kBackwardMinBlocks)
    vocab_backward_kernel(GspoLogits logits, const int64_t* target, const float* lse,
                          const float* coefficient, float scale, T* grad, int64_t grad_row_stride) {
  // Accumulating holds the gradient's packets too: half as many per thread.
  constexpr int kUnroll = kAccumulate ? 4 : 8;
  const int64_t row = int64_t(gridDim.x) - 1 - blockIdx.x;
  const int64_t y = target[row];
  const bool labelled = y >= 0 && y < logits.vocab;
  if (!labelled && kAccumulate) return;
  const T* p = static_cast<const T*>(logits.data) + row * logits.row_stride;
  T* g = grad + row * grad_row_stride;
  const float c = labelled ? coefficient[row] : 0.f;
  const float row_lse = labelled ? lse[row] : 0.f;
  // p = 2^((λ·z − lse)·log2 e): the difference by one fused multiply-add, as accurate as the
  // natural-base form.
  auto prob = [&](float z) { return exp2_fast(fmaf(z, scale, -row_lse) * kLog2e); };
  const int64_t vectors = logits.vocab / kWidth;
  const int64_t y_vector = labelled ? y / kWidth : -1;
  const int y_lane = labelled ? static_cast<int>(y - y_vector * kWidth) : -1;
  for (int64_t j = threadIdx.x; j < vectors; j += int64_t(kThreads) * kUnroll) {
    Packet<T, kWidth> x[kUnroll], previous[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = j + int64_t(u) * kThreads;
      if (v < vectors) {
        if (labelled) x[u].load_streaming(p + v * kWidth);
        if constexpr (kAccumulate) previous[u].load(g + v * kWidth);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = j + int64_t(u) * kThreads;
      if (v >= vectors) break;
      float out[kWidth];
#pragma unroll
      for (int e = 0; e < kWidth; ++e) {
        const float value = labelled ? c * prob(x[u].at(e)) : 0.f;
        out[e] = kAccumulate ? previous[u].at(e) + value : value;
      }
      if (v == y_vector) {
        // The one packet holding the sampled token: recompute that element with its −c·δ.
#pragma unroll
        for (int e = 0; e < kWidth; ++e) {
          if (e != y_lane) continue;
          const float value = c * (prob(x[u].at(e)) - 1.f);
          out[e] = kAccumulate ? previous[u].at(e) + value : value;
        }
      }
      Packet<T, kWidth>::store(g + v * kWidth, out);
    }
  }
  for (int64_t j = vectors * kWidth + threadIdx.x; j < logits.vocab; j += kThreads) {
    const float value =
        labelled ? c * (prob(to_float(p[j])) - static_cast<float>(j == y)) : 0.f;
    g[j] = from_float<T>(kAccumulate ? to_float(g[j]) + value : value);
  }
}

bool aligned16(const void* p, int64_t row_stride, int64_t element_bytes) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0 && (row_stride * element_bytes) % 16 == 0;
}

// Calls f(T*, width) with the element type and the access width (16-byte vectors when every row
// start is 16-byte aligned, else scalar).
template <typename F>
cudaError_t dispatch(const GspoLogits& logits, const void* grad, int64_t grad_row_stride, F&& f) {
  const bool bf16 = logits.type == GspoLogitsType::kBFloat16;
  const int64_t bytes = bf16 ? 2 : 4;
  const bool vector = aligned16(logits.data, logits.row_stride, bytes) &&
                      (grad == nullptr || aligned16(grad, grad_row_stride, bytes));
  if (bf16) {
    return vector ? f(static_cast<__nv_bfloat16*>(nullptr), std::integral_constant<int, 8>())
                  : f(static_cast<__nv_bfloat16*>(nullptr), std::integral_constant<int, 1>());
  }
  return vector ? f(static_cast<float*>(nullptr), std::integral_constant<int, 4>())
                : f(static_cast<float*>(nullptr), std::integral_constant<int, 1>());
}

}  // namespace

cudaError_t gspo_vocab_forward(const GspoLogits& logits, const int64_t* target,
                               float logits_scale, float* logprobs, float* lse, int* status,
                               cudaStream_t stream) {
  if (logits.rows == 0) return cudaSuccess;
  return dispatch(logits, nullptr, 0, [&](auto* type, auto width) {
    using T = std::remove_pointer_t<decltype(type)>;
    vocab_forward_kernel<T, decltype(width)::value><<<logits.rows, kThreads, 0, stream>>>(
        logits, target, logits_scale, logprobs, lse, status);
    return cudaGetLastError();
  });
}

cudaError_t gspo_vocab_backward(const GspoLogits& logits, const int64_t* target, const float* lse,
                                const float* coefficient, float logits_scale, void* grad,
                                int64_t grad_row_stride, bool accumulate, cudaStream_t stream) {
  if (logits.rows == 0) return cudaSuccess;
  return dispatch(logits, grad, grad_row_stride, [&](auto* type, auto width) {
    using T = std::remove_pointer_t<decltype(type)>;
    constexpr int kWidth = decltype(width)::value;
    if (accumulate) {
      vocab_backward_kernel<T, kWidth, true><<<logits.rows, kThreads, 0, stream>>>(
          logits, target, lse, coefficient, logits_scale, static_cast<T*>(grad), grad_row_stride);
    } else {
      vocab_backward_kernel<T, kWidth, false><<<logits.rows, kThreads, 0, stream>>>(
          logits, target, lse, coefficient, logits_scale, static_cast<T*>(grad), grad_row_stride);
    }
    return cudaGetLastError();
  });
}

}  // namespace dspine::kernels
