#include "kernels/cosine_alignment.h"

#include <cuda_bf16.h>

#include "kernels/norm_swiglu_common.cuh"

namespace dspine::kernels {
namespace {

constexpr int kWarps = 8;  // rows per block of 256 threads
constexpr int kPack = 8;   // elements per lane per load: 16 bytes of bf16

using detail::load_floats;
using detail::store_floats;
using detail::warp_sum;

// <f, u>, |f|² and |u|² of one row, summed in fp32 over the warp (every lane gets them).
struct Sums {
  float dot = 0, ff = 0, uu = 0;
};

template <typename T>
__device__ __forceinline__ Sums row_sums(const T* f, const float* u, int64_t rank, int lane) {
  Sums s;
  for (int64_t i = static_cast<int64_t>(lane) * kPack; i < rank; i += 32 * kPack) {
    float fv[kPack], uv[kPack];
    load_floats(f + i, fv);
    load_floats(u + i, uv);
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      s.dot += fv[k] * uv[k];
      s.ff += fv[k] * fv[k];
      s.uu += uv[k] * uv[k];
    }
  }
  return {warp_sum(s.dot), warp_sum(s.ff), warp_sum(s.uu)};
}

struct Norms {
  float f, u, cosine;
};

__device__ __forceinline__ Norms norms(const Sums& s, float eps) {
  const float nf = fmaxf(sqrtf(s.ff), eps), nu = fmaxf(sqrtf(s.uu), eps);
  return {nf, nu, s.dot / (nf * nu)};
}

// This warp's row of [blocks, layers, positions]: its index, where it starts in f, and its code.
struct Row {
  int64_t index = 0, f_offset = 0;
  const float* u = nullptr;
};

__device__ __forceinline__ bool locate(const AlignmentRows& s, const float* codes, Row* row) {
  row->index = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row->index >= s.blocks * s.layers * s.positions) return false;
  const int64_t position = row->index % s.positions;
  const int64_t layer = (row->index / s.positions) % s.layers;
  const int64_t block = row->index / (s.positions * s.layers);
  row->f_offset = block * s.block_stride + layer * s.layer_stride + position * s.position_stride;
  row->u = codes + (block * s.positions + position) * s.rank;
  return true;
}

template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    cosine_alignment_forward_kernel(const T* features, const float* codes, float* cosine,
                                    AlignmentRows s) {
  Row row;
  if (!locate(s, codes, &row)) return;
  const int lane = threadIdx.x % 32;
  const Norms n = norms(row_sums(features + row.f_offset, row.u, s.rank, lane), s.eps);
  if (lane == 0) cosine[row.index] = n.cosine;
}

template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    cosine_alignment_backward_kernel(const float* grad_cosine, const T* features,
                                     const float* codes, T* grad_features, AlignmentRows s) {
  Row row;
  if (!locate(s, codes, &row)) return;
  const int lane = threadIdx.x % 32;
  const T* f = features + row.f_offset;
  const float* u = row.u;
  const Norms n = norms(row_sums(f, u, s.rank, lane), s.eps);
  const float g = grad_cosine[row.index];
  const float along_u = g / (n.f * n.u), along_f = g * n.cosine / (n.f * n.f);
  T* out = grad_features + row.index * s.rank;
  for (int64_t i = static_cast<int64_t>(lane) * kPack; i < s.rank; i += 32 * kPack) {
    float fv[kPack], uv[kPack], dv[kPack];
    load_floats(f + i, fv);
    load_floats(u + i, uv);
#pragma unroll
    for (int k = 0; k < kPack; ++k) dv[k] = along_u * uv[k] - along_f * fv[k];
    store_floats(out + i, dv);
  }
}

int blocks_for(const AlignmentRows& s) {
  return static_cast<int>((s.blocks * s.layers * s.positions + kWarps - 1) / kWarps);
}

bool aligned_rows(const void* features, const AlignmentRows& s) {
  const bool strides = (s.block_stride % kPack == 0) && (s.layer_stride % kPack == 0) &&
                       (s.position_stride % kPack == 0);
  return strides && reinterpret_cast<uintptr_t>(features) % 16 == 0;
}

}  // namespace

bool cosine_alignment_supported(int64_t rank, DType type) {
  return rank > 0 && rank % kPack == 0 && (type == DType::kFloat32 || type == DType::kBFloat16);
}

cudaError_t cosine_alignment_forward(const void* features, const float* codes, float* cosine,
                                     const AlignmentRows& s, cudaStream_t stream) {
  if (!cosine_alignment_supported(s.rank, s.type) || !aligned_rows(features, s)) {
    return cudaErrorInvalidValue;
  }
  if (s.blocks * s.layers * s.positions == 0) return cudaSuccess;
  if (s.type == DType::kFloat32) {
    cosine_alignment_forward_kernel<float><<<blocks_for(s), kWarps * 32, 0, stream>>>(
        static_cast<const float*>(features), codes, cosine, s);
  } else {
    cosine_alignment_forward_kernel<__nv_bfloat16><<<blocks_for(s), kWarps * 32, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(features), codes, cosine, s);
  }
  return cudaGetLastError();
}

cudaError_t cosine_alignment_backward(const float* grad_cosine, const void* features,
                                      const float* codes, void* grad_features,
                                      const AlignmentRows& s, cudaStream_t stream) {
  if (!cosine_alignment_supported(s.rank, s.type) || !aligned_rows(features, s)) {
    return cudaErrorInvalidValue;
  }
  if (s.blocks * s.layers * s.positions == 0) return cudaSuccess;
  if (s.type == DType::kFloat32) {
    cosine_alignment_backward_kernel<float><<<blocks_for(s), kWarps * 32, 0, stream>>>(
        grad_cosine, static_cast<const float*>(features), codes, static_cast<float*>(grad_features),
        s);
  } else {
    cosine_alignment_backward_kernel<__nv_bfloat16><<<blocks_for(s), kWarps * 32, 0, stream>>>(
        grad_cosine, static_cast<const __nv_bfloat16*>(features), codes,
        static_cast<__nv_bfloat16*>(grad_features), s);
  }
  return cudaGetLastError();
}

}  // namespace dspine::kernels
