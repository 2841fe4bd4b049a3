// Device helpers shared by the project's elementwise and row kernels: fp32 conversions, 128-bit
// packs, warp/block sums and dtype dispatch. CUDA only; no framework headers.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/norm_swiglu_types.h"

namespace dspine::kernels::detail {

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_float<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// N consecutive elements moved as one access: 16 bytes (one 128-bit load/store) when
// N * sizeof(T) == 16, a plain scalar access when N == 1.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// 16-byte packs go through uint4 so that the compiler emits one 128-bit access.
template <typename T, int N>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p) {
  Pack<T, N> out;
  if constexpr (sizeof(Pack<T, N>) == 16) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    memcpy(&out, &raw, 16);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) out.v[k] = p[k];
  }
  return out;
}

// A pack from N fp32 values, 16-bit types converted two at a time (one cvt per pair).
template <typename T, int N>
__device__ __forceinline__ Pack<T, N> pack_from_floats(const float (&f)[N]) {
  Pack<T, N> out;
  if constexpr (std::is_same_v<T, __nv_bfloat16> && N % 2 == 0) {
#pragma unroll
    for (int k = 0; k < N; k += 2) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(f[k], f[k + 1]);
      out.v[k] = pair.x;
      out.v[k + 1] = pair.y;
    }
  } else if constexpr (std::is_same_v<T, __half> && N % 2 == 0) {
#pragma unroll
    for (int k = 0; k < N; k += 2) {
      const __half2 pair = __floats2half2_rn(f[k], f[k + 1]);
      out.v[k] = pair.x;
      out.v[k + 1] = pair.y;
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) out.v[k] = from_float<T>(f[k]);
  }
  return out;
}

__device__ __forceinline__ uint32_t bits(float v) { return __float_as_uint(v); }
__device__ __forceinline__ uint32_t bits(__half v) { return __half_as_ushort(v); }
__device__ __forceinline__ uint32_t bits(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }

// One st.global.v4 written out: for strided rows the compiler split a uint4 store into four
// 32-bit stores (it could not prove the 16-byte alignment the caller guarantees).
template <typename T, int N>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, N>& v) {
  if constexpr (sizeof(Pack<T, N>) == 16) {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[k] = sizeof(T) == 4 ? bits(v.v[k]) : bits(v.v[2 * k]) | (bits(v.v[2 * k + 1]) << 16);
    }
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[1]),
                 "r"(w[2]), "r"(w[3])
                 : "memory");
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) p[k] = v.v[k];
  }
}

// Eight consecutive elements (16 bytes of bf16, 32 of fp32) to and from fp32, for kernels that
// keep values in fp32 arrays rather than packs.
template <typename T>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[8]);
template <>
__device__ __forceinline__ void load_floats<float>(const float* p, float (&out)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
  out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}
template <>
__device__ __forceinline__ void load_floats<__nv_bfloat16>(const __nv_bfloat16* p,
                                                         float (&out)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
  for (int i = 0; i < 8 / 2; ++i) {
    const float2 v = __bfloat1622float2(pairs[i]);
    out[2 * i] = v.x, out[2 * i + 1] = v.y;
  }
}

template <typename T>
__device__ __forceinline__ void store_floats(T* p, const float (&in)[8]);
template <>
__device__ __forceinline__ void store_floats<float>(float* p, const float (&in)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(in[0], in[1], in[2], in[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(in[4], in[5], in[6], in[7]);
}
template <>
__device__ __forceinline__ void store_floats<__nv_bfloat16>(__nv_bfloat16* p,
                                                          const float (&in)[8]) {
  uint4 raw;
  __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&raw);
  for (int i = 0; i < 8 / 2; ++i) pairs[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the whole block, returned to every thread; `scratch` holds 32 floats. The order of
// additions is fixed, so the result is deterministic.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : 0.0f;
  total = warp_sum(total);
  __syncthreads();  // scratch is reused by the next call
  return total;
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with the CUDA element type for `dtype`.
template <typename F>
cudaError_t dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f(TypeTag<float>{});
    case DType::kFloat16:
      return f(TypeTag<__half>{});
    case DType::kBFloat16:
      return f(TypeTag<__nv_bfloat16>{});
  }
  return cudaErrorInvalidValue;
}

inline size_t dtype_size(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline int multiprocessor_count() {
  int device = 0;
  cudaGetDevice(&device);
  int count = 0;
  cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  return count > 0 ? count : 1;
}

// silu(g) · u in fp32 as the SwiGLU kernels and the GEMM's SwiGLU epilogue compute it, so that a
// backward that recomputes the activation gets the forward's bits. The exponential and reciprocal
// are the approximate MUFU forms (~2 ulp): an IEEE-rounded 1/x compiled to a multi-instruction
// sequence that, with the bf16 conversions, made the SwiGLU kernels issue-bound.
__device__ __forceinline__ float sigmoid(float g) { return __fdividef(1.0f, 1.0f + __expf(-g)); }
__device__ __forceinline__ float swiglu_value(float g, float u) { return g * sigmoid(g) * u; }

}  // namespace dspine::kernels::detail
