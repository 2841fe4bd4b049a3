#include "kernels/qk_norm_rope.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "kernels/norm_swiglu_common.cuh"

namespace dspine::kernels {
namespace {

using detail::from_float;
using detail::to_float;
using detail::warp_sum;

// One warp per (row, head) vector; lane l holds elements [l·V, l·V + V) with V = D/32, so the
// rotate_half partner of element i (i ± D/2) sits in lane l ± 16, i.e. lane l ^ 16.
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// The backward grid is persistent (each warp keeps its dweight partial in registers); 8 CTAs of
// 256 threads fill an SM.
constexpr int kBackwardCtasPerSm = 8;

// V elements of one lane moved as one 4-, 8- or 16-byte access.
template <int kBytes>
struct Word;
template <>
struct Word<4> {
  using type = uint32_t;
};
template <>
struct Word<8> {
  using type = uint2;
};
template <>
struct Word<16> {
  using type = uint4;
};

template <typename T, int kV>
__device__ __forceinline__ void load_floats(const T* p, float (&f)[kV]) {
  using W = typename Word<sizeof(T) * kV>::type;
  const W raw = *reinterpret_cast<const W*>(p);
  T v[kV];
  memcpy(v, &raw, sizeof(raw));
#pragma unroll
  for (int k = 0; k < kV; ++k) f[k] = to_float(v[k]);
}

// Converted in pairs and stored as one access; written out in PTX because the compiler split a
// plain wide store into 32-bit ones (it cannot prove the alignment the launch checks).
template <typename T, int kV>
__device__ __forceinline__ void store_floats(T* p, const float (&f)[kV]) {
  const detail::Pack<T, kV> packed = detail::pack_from_floats<T, kV>(f);
  if constexpr (sizeof(packed) == 16) {
    detail::store_pack(p, packed);
  } else if constexpr (sizeof(packed) == 8) {
    uint32_t w[2];
    memcpy(w, &packed, 8);
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(w[0]), "r"(w[1]) : "memory");
  } else {
    uint32_t w;
    memcpy(&w, &packed, 4);
    *reinterpret_cast<uint32_t*>(p) = w;
  }
}

// vectors < 2^31 (qk_norm_rope_supported), so the index arithmetic divides in 32 bits: a 64-bit
// division is emulated in ~70 instructions, as many as the rest of a forward warp's work.
struct Geometry {
  int64_t vectors;
  uint32_t heads, positions;
  int64_t x_row_stride, table_batch_stride, table_position_stride;
};

// Element offsets of vector `vector` (row-major over rows, then heads) in x and in the tables.
struct Offsets {
  int64_t x, table;
};

__device__ __forceinline__ Offsets locate(const Geometry& g, int64_t vector, int head_dim) {
  const uint32_t row = uint32_t(vector) / g.heads;
  const uint32_t head = uint32_t(vector) - row * g.heads;
  const uint32_t b = row / g.positions;
  const uint32_t p = row - b * g.positions;
  return {int64_t(row) * g.x_row_stride + int64_t(head) * head_dim,
          int64_t(b) * g.table_batch_stride + int64_t(p) * g.table_position_stride};
}

// y = w ⊙ x·rstd, out = y ⊙ cos + rot(y) ⊙ sin with rot(y)[i] = −y[i + D/2] for i < D/2 and
// y[i − D/2] for i ≥ D/2.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    qk_norm_rope_forward_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                                const T* __restrict__ cos_table, const T* __restrict__ sin_table,
                                T* __restrict__ out, float* __restrict__ rstd, Geometry g,
                                float eps) {
  constexpr int kV = kD / 32;
  const int lane = threadIdx.x % 32;
  const int64_t vector = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (vector >= g.vectors) return;  // warp-uniform: no shuffle loses a lane
  const Offsets at = locate(g, vector, kD);
  const int first = lane * kV;
  float xv[kV], w[kV], c[kV], s[kV];
  load_floats<T, kV>(x + at.x + first, xv);
  load_floats<T, kV>(weight + first, w);
  load_floats<T, kV>(cos_table + at.table + first, c);
  load_floats<T, kV>(sin_table + at.table + first, s);
  float sumsq = 0.0f;
#pragma unroll
  for (int k = 0; k < kV; ++k) sumsq += xv[k] * xv[k];
  const float r = rsqrtf(warp_sum(sumsq) / float(kD) + eps);
  if (lane == 0) rstd[vector] = r;
  const float sign = lane < 16 ? -1.0f : 1.0f;
  float o[kV];
#pragma unroll
  for (int k = 0; k < kV; ++k) {
    const float y = w[k] * xv[k] * r;
    const float partner = __shfl_xor_sync(0xffffffffu, y, 16);
    o[k] = y * c[k] + sign * partner * s[k];
  }
  store_floats<T, kV>(out + vector * kD + first, o);
}

// Backward, with g = grad_out. out_j = y_j cos_j + σ_j y_{j^} sin_j (j^ = j ± D/2, σ_j = −1 for
// j < D/2, +1 above), so dy_i = g_i cos_i + σ_{i^} g_{i^} sin_{i^}: with u = g ⊙ sin,
// dy_i = g_i cos_i + u[i + D/2] for i < D/2 and g_i cos_i − u[i − D/2] for i ≥ D/2 (rotᵀ(u)).
// Then the RMSNorm backward of y = w ⊙ x·r, r = (mean(x²) + eps)^(−1/2):
//   dw_i += dy_i x_i r,   dx_i = r w_i dy_i − x_i r³ Σ_j(dy_j w_j x_j) / D.
// Each warp sums dw over its vectors in registers; the CTA's warps are added in a fixed order
// and written to partial[blockIdx.x].
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    qk_norm_rope_backward_kernel(const T* __restrict__ grad_out, const T* __restrict__ x,
                                 const T* __restrict__ weight, const float* __restrict__ rstd,
                                 const T* __restrict__ cos_table, const T* __restrict__ sin_table,
                                 T* __restrict__ dx, float* __restrict__ partial, Geometry g) {
  constexpr int kV = kD / 32;
  __shared__ float warp_dw[kWarps][kD];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int first = lane * kV;
  float w[kV], dw[kV];
  load_floats<T, kV>(weight + first, w);
#pragma unroll
  for (int k = 0; k < kV; ++k) dw[k] = 0.0f;
  const float sign = lane < 16 ? 1.0f : -1.0f;
  for (int64_t vector = int64_t(blockIdx.x) * kWarps + warp; vector < g.vectors;
       vector += int64_t(gridDim.x) * kWarps) {
    const Offsets at = locate(g, vector, kD);
    float gv[kV], xv[kV], c[kV], s[kV];
    load_floats<T, kV>(grad_out + vector * kD + first, gv);
    load_floats<T, kV>(x + at.x + first, xv);
    load_floats<T, kV>(cos_table + at.table + first, c);
    load_floats<T, kV>(sin_table + at.table + first, s);
    const float r = rstd[vector];
    float dy[kV];
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      const float partner = __shfl_xor_sync(0xffffffffu, gv[k] * s[k], 16);
      dy[k] = gv[k] * c[k] + sign * partner;
      dw[k] += dy[k] * xv[k] * r;
      dot += dy[k] * w[k] * xv[k];
    }
    const float coef = warp_sum(dot) * r * r * r / float(kD);
    float d[kV];
#pragma unroll
    for (int k = 0; k < kV; ++k) d[k] = r * w[k] * dy[k] - coef * xv[k];
    store_floats<T, kV>(dx + vector * kD + first, d);
  }
#pragma unroll
  for (int k = 0; k < kV; ++k) warp_dw[warp][first + k] = dw[k];
  __syncthreads();
  for (int col = threadIdx.x; col < kD; col += kThreads) {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) sum += warp_dw[i][col];
    partial[int64_t(blockIdx.x) * kD + col] = sum;
  }
}

// Calls f(std::integral_constant<int, D>{}) for the head dims the kernels are built for.
template <typename F>
cudaError_t dispatch_head_dim(int64_t head_dim, F&& f) {
  switch (head_dim) {
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    default:
      return cudaErrorInvalidValue;
  }
}

int64_t vectors_of(const QkNormRopeShape& s) { return s.batch * s.positions * s.heads; }

Geometry geometry(const QkNormRopeShape& s, const RopeTableView& rope) {
  return {vectors_of(s),
          uint32_t(s.heads),
          uint32_t(s.positions),
          s.x_row_stride,
          rope.batch_stride,
          rope.position_stride};
}

bool multiple_of_16_bytes(int64_t elements, DType dtype) {
  return elements * int64_t(detail::dtype_size(dtype)) % 16 == 0;
}

bool launchable(const QkNormRopeShape& s, const RopeTableView& rope, DType dtype,
                std::initializer_list<const void*> pointers) {
  if (!qk_norm_rope_supported(s, dtype) || !multiple_of_16_bytes(rope.batch_stride, dtype) ||
      !multiple_of_16_bytes(rope.position_stride, dtype) || !detail::aligned16(rope.cos) ||
      !detail::aligned16(rope.sin)) {
    return false;
  }
  return std::all_of(pointers.begin(), pointers.end(), detail::aligned16);
}

}  // namespace

bool qk_norm_rope_supported(const QkNormRopeShape& s, DType dtype) {
  return (s.head_dim == 64 || s.head_dim == 128) && s.batch >= 0 && s.positions >= 0 &&
         s.heads >= 0 && vectors_of(s) < (int64_t(1) << 31) &&
         s.x_row_stride >= s.heads * s.head_dim && multiple_of_16_bytes(s.x_row_stride, dtype);
}

cudaError_t qk_norm_rope_forward(const QkNormRopeShape& shape, const void* x, const void* weight,
                                 const RopeTableView& rope, float eps, void* out, float* rstd,
                                 DType dtype, cudaStream_t stream) {
  if (!launchable(shape, rope, dtype, {x, weight, out})) return cudaErrorInvalidValue;
  const int64_t vectors = vectors_of(shape);
  if (vectors == 0) return cudaSuccess;
  const int64_t grid = (vectors + kWarps - 1) / kWarps;
  return detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return dispatch_head_dim(shape.head_dim, [&](auto d) {
      qk_norm_rope_forward_kernel<T, decltype(d)::value><<<unsigned(grid), kThreads, 0, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(rope.cos),
          static_cast<const T*>(rope.sin), static_cast<T*>(out), rstd, geometry(shape, rope), eps);
      return cudaGetLastError();
    });
  });
}

int64_t qk_norm_rope_backward_ctas(const QkNormRopeShape& shape) {
  const int64_t needed = (vectors_of(shape) + kWarps - 1) / kWarps;
  return std::min<int64_t>(needed, int64_t(kBackwardCtasPerSm) * detail::multiprocessor_count());
}

cudaError_t qk_norm_rope_backward(const QkNormRopeShape& shape, const void* grad_out, const void* x,
                                  const void* weight, const float* rstd, const RopeTableView& rope,
                                  void* dx, float* dweight_partials, DType dtype,
                                  cudaStream_t stream) {
  if (!launchable(shape, rope, dtype, {grad_out, x, weight, dx})) return cudaErrorInvalidValue;
  const int64_t ctas = qk_norm_rope_backward_ctas(shape);
  if (ctas == 0) return cudaSuccess;
  return detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return dispatch_head_dim(shape.head_dim, [&](auto d) {
      qk_norm_rope_backward_kernel<T, decltype(d)::value><<<unsigned(ctas), kThreads, 0, stream>>>(
          static_cast<const T*>(grad_out), static_cast<const T*>(x), static_cast<const T*>(weight),
          rstd, static_cast<const T*>(rope.cos), static_cast<const T*>(rope.sin),
          static_cast<T*>(dx), dweight_partials, geometry(shape, rope));
      return cudaGetLastError();
    });
  });
}

}  // namespace dspine::kernels
