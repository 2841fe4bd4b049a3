// Row statistics and inverse-CDF draws over rows of logits: see logit_rows.h. Memory-bound, one
// block of kThreads per row. Every thread owns kItems consecutive columns of each tile (one
// 16-byte load of bf16), so the draw pass can scan the tile in column order: a thread's inclusive
// prefix over its items plus the block's exclusive scan of the thread totals. A draw's column is
// the smallest one whose prefix passes its target, found by atomicMin over the threads that pass
// it: the same column whatever the threads' timing, so the kernel is deterministic.
//
// Rounding (docs/kernels.md, "Draws from rows of logits"): the block scan adds the thread totals
// in its own tree order, so a thread's start is not exactly the previous thread's start plus its
// total. A target can fall in the gap between the two, and then the first thread whose start
// passes it would take its first column even where that column has no weight, or lies past the
// vocabulary. So a thread only offers columns of nonzero probability: the first such column whose
// prefix passes the target.
#include "kernels/logit_rows.h"

#include <cuda_bf16.h>

#include <cub/block/block_scan.cuh>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/norm_swiglu_common.cuh"

namespace dspine::kernels {
namespace {

using detail::to_float;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kItems = 8;
constexpr int64_t kTile = int64_t(kThreads) * kItems;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr unsigned long long kNotFound = ~0ull;

// Columns [col, col + kItems) of a row; past the vocabulary −inf (weight 0, never the maximum).
template <typename T>
__device__ __forceinline__ void load_items(const T* row, int64_t col, int64_t vocab, bool vector,
                                           float (&z)[kItems]) {
  if (vector && col + kItems <= vocab) {
    if constexpr (std::is_same_v<T, float>) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(row + col));
      const float4 b = __ldg(reinterpret_cast<const float4*>(row + col) + 1);
      z[0] = a.x, z[1] = a.y, z[2] = a.z, z[3] = a.w, z[4] = b.x, z[5] = b.y, z[6] = b.z,
      z[7] = b.w;
    } else {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(row + col));
      const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // little-endian: the even column is the low half
        z[2 * i] = __uint_as_float(words[i] << 16);
        z[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
      }
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kItems; ++i) z[i] = col + i < vocab ? to_float(row[col + i]) : -INFINITY;
}

// A row's running maximum (value, first column) and Σ 2^(k·(z − max)) for the two scales.
// Plain data (no initialisers), so that it can live in shared memory.
struct RowStats {
  float max;
  int64_t argmax;
  float policy_sum;    // k = λ·log2(e)
  float sampling_sum;  // k = β·log2(e)

  __device__ __forceinline__ static RowStats empty() { return {-INFINITY, 0, 0.f, 0.f}; }

  __device__ __forceinline__ void merge(const RowStats& o, float kp, float ks) {
    if (o.max > max || (o.max == max && o.argmax < argmax)) argmax = o.argmax;
    const float top = fmaxf(max, o.max);
    if (top == -INFINITY) return;  // both empty
    policy_sum = policy_sum * exp2f((max - top) * kp) + o.policy_sum * exp2f((o.max - top) * kp);
    sampling_sum =
        sampling_sum * exp2f((max - top) * ks) + o.sampling_sum * exp2f((o.max - top) * ks);
    max = top;
  }
  __device__ __forceinline__ void shuffle_merge(int offset, float kp, float ks) {
    RowStats o = RowStats::empty();
    o.max = __shfl_xor_sync(0xffffffffu, max, offset);
    o.argmax = __shfl_xor_sync(0xffffffffu, argmax, offset);
    o.policy_sum = __shfl_xor_sync(0xffffffffu, policy_sum, offset);
    o.sampling_sum = __shfl_xor_sync(0xffffffffu, sampling_sum, offset);
    merge(o, kp, ks);
  }
};

// Pass 1: the row's statistics, in a fixed reduction tree (warps by shuffle, then warp 0).
// *nonfinite: whether the row holds NaN or +inf (the draws then have nothing to stand on).
template <typename T>
__device__ RowStats row_stats(const T* row, int64_t vocab, bool vector, float kp, float ks,
                              bool* nonfinite) {
  RowStats s = RowStats::empty();
  bool bad = false;
  for (int64_t col = int64_t(threadIdx.x) * kItems; col < vocab; col += kTile) {
    float z[kItems];
    load_items(row, col, vocab, vector, z);
    RowStats tile = RowStats::empty();
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      bad |= !(z[i] < INFINITY);  // NaN or +inf
      if (z[i] > tile.max) tile.max = z[i], tile.argmax = col + i;
    }
    if (tile.max == -INFINITY) continue;
#pragma unroll
    for (int i = 0; i < kItems; ++i) tile.policy_sum += exp2f((z[i] - tile.max) * kp);
    if (ks == kp) {  // temperature 1: one exponential per column
      tile.sampling_sum = tile.policy_sum;
    } else {
#pragma unroll
      for (int i = 0; i < kItems; ++i) tile.sampling_sum += exp2f((z[i] - tile.max) * ks);
    }
    s.merge(tile, kp, ks);
  }
  *nonfinite = __syncthreads_or(bad);
  __shared__ RowStats warp_stats[kWarps];
  for (int offset = 16; offset > 0; offset /= 2) s.shuffle_merge(offset, kp, ks);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_stats[warp] = s;
  __syncthreads();
  if (warp == 0) {
    s = lane < kWarps ? warp_stats[lane] : RowStats::empty();
    for (int offset = 16; offset > 0; offset /= 2) s.shuffle_merge(offset, kp, ks);
    if (lane == 0) warp_stats[0] = s;
  }
  __syncthreads();
  return warp_stats[0];
}

// A column's weight exp(β·(z − max)) in the form the kernel's outputs use, and whether its
// probability weight / total is nonzero in fp32 (never past the vocabulary, never for NaN).
__device__ __forceinline__ float column_weight(float z, float max, float ks) {
  return exp2f((z - max) * ks);
}
__device__ __forceinline__ bool drawable(float weight, float total) { return weight / total > 0.f; }

// Pass 2: found[g] = the first column of nonzero probability whose prefix weight exceeds
// targets[g] (kNotFound when none does); returns the last column of nonzero probability when a
// draw is left unfound (a target at or past the scan's own total).
template <typename T>
__device__ int64_t draw_columns(const T* row, int64_t vocab, bool vector, float max, float ks,
                                float total, const float* targets, unsigned long long* found,
                                int64_t draws) {
  using Scan = cub::BlockScan<float, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ unsigned long long last_drawable;  // 1 + column, 0 = none yet
  if (threadIdx.x == 0) last_drawable = 0;
  float carry = 0.f;  // total weight of the tiles before this one
  int64_t last = -1;
  for (int64_t tile = 0; tile < vocab; tile += kTile) {
    const int64_t col = tile + int64_t(threadIdx.x) * kItems;
    float z[kItems], prefix[kItems];
    unsigned offered = 0;  // bit i: column col + i has nonzero probability
    load_items(row, col, vocab, vector, z);
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const float w = column_weight(z[i], max, ks);
      if (drawable(w, total)) offered |= 1u << i, last = col + i;
      sum += w;
      prefix[i] = sum;
    }
    float before, tile_total;
    Scan(scan).ExclusiveSum(sum, before, tile_total);
    const float start = carry + before;
    for (int64_t g = 0; g < draws; ++g) {
      // Columns found before this tile are final; this tile's candidates all compete.
      if (!offered || found[g] < static_cast<unsigned long long>(tile) ||
          !(targets[g] < start + sum))
        continue;
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        if ((offered >> i & 1u) && start + prefix[i] > targets[g]) {
          atomicMin(&found[g], static_cast<unsigned long long>(col + i));
          break;
        }
      }
    }
    carry += tile_total;
    bool pending = false;
    __syncthreads();
    for (int64_t g = threadIdx.x; g < draws; g += kThreads) pending |= found[g] == kNotFound;
    if (!__syncthreads_or(pending)) return -1;
  }
  if (last >= 0) atomicMax(&last_drawable, static_cast<unsigned long long>(last + 1));
  __syncthreads();
  return static_cast<int64_t>(last_drawable) - 1;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    logit_rows_kernel(GspoLogits logits, float policy_scale, float sampling_scale,
                      const float* uniforms, int64_t draws, LogitRowOutputs out, bool vector) {
  const int64_t r = blockIdx.x;
  const T* row = static_cast<const T*>(logits.data) + r * logits.row_stride;
  const float kp = policy_scale * kLog2e, ks = sampling_scale * kLog2e;
  bool nonfinite = false;
  const RowStats s = row_stats(row, logits.vocab, vector, kp, ks, &nonfinite);
  // lse = λ·max + ln Σ exp(λ·(z − max)).
  const float lse = policy_scale * s.max + log2f(s.policy_sum) * kLn2;
  if (threadIdx.x == 0) {
    if (out.argmax) out.argmax[r] = s.argmax;
    if (out.lse) out.lse[r] = lse;
  }
  if (draws == 0) return;
  if (nonfinite || s.max == -INFINITY) {  // NaN, +inf, or no finite logit: nothing to draw from
    for (int64_t g = threadIdx.x; g < draws; g += kThreads) {
      out.choices[r * draws + g] = kLogitRowsNoDraw;
      out.logprobs[r * draws + g] = NAN;
      out.probs[r * draws + g] = NAN;
    }
    return;
  }

  extern __shared__ unsigned long long found[];  // [draws], then the targets [draws] fp32
  float* targets = reinterpret_cast<float*>(found + draws);
  for (int64_t g = threadIdx.x; g < draws; g += kThreads) {
    found[g] = kNotFound;
    targets[g] = uniforms[r * draws + g] * s.sampling_sum;
  }
  __syncthreads();
  const int64_t fallback = draw_columns(row, logits.vocab, vector, s.max, ks, s.sampling_sum,
                                        targets, found, draws);
  for (int64_t g = threadIdx.x; g < draws; g += kThreads) {
    const int64_t c = found[g] == kNotFound ? fallback : static_cast<int64_t>(found[g]);
    const float z = to_float(row[c]);
    out.choices[r * draws + g] = c;
    out.logprobs[r * draws + g] = policy_scale * z - lse;
    out.probs[r * draws + g] = column_weight(z, s.max, ks) / s.sampling_sum;
  }
}

template <typename T>
cudaError_t launch(const GspoLogits& logits, float policy_scale, float sampling_scale,
                   const float* uniforms, int64_t draws, const LogitRowOutputs& out,
                   cudaStream_t stream) {
  const bool vector = reinterpret_cast<uintptr_t>(logits.data) % 16 == 0 &&
                      (logits.row_stride * int64_t(sizeof(T))) % 16 == 0 &&
                      (kItems * sizeof(T)) % 16 == 0;
  const size_t shared = size_t(draws) * (sizeof(unsigned long long) + sizeof(float));
  logit_rows_kernel<T><<<static_cast<unsigned>(logits.rows), kThreads, shared, stream>>>(
      logits, policy_scale, sampling_scale, uniforms, draws, out, vector);
  return cudaGetLastError();
}

}  // namespace

cudaError_t logit_rows(const GspoLogits& logits, float logits_scale, float sampling_scale,
                       const float* uniforms, int64_t draws_per_row, const LogitRowOutputs& out,
                       cudaStream_t stream) {
  if (draws_per_row < 0 || draws_per_row > kLogitRowsMaxDraws || logits.vocab <= 0 ||
      !(logits_scale > 0.f) || !std::isfinite(logits_scale * kLog2e) ||
      !(sampling_scale > 0.f) || !std::isfinite(sampling_scale * kLog2e))
    return cudaErrorInvalidValue;
  if (draws_per_row > 0 && (!uniforms || !out.choices || !out.logprobs || !out.probs))
    return cudaErrorInvalidValue;
  if (logits.rows == 0) return cudaSuccess;
  return logits.type == GspoLogitsType::kFloat32
             ? launch<float>(logits, logits_scale, sampling_scale, uniforms, draws_per_row, out,
                             stream)
             : launch<__nv_bfloat16>(logits, logits_scale, sampling_scale, uniforms, draws_per_row,
                                     out, stream);
}

}  // namespace dspine::kernels
