#include "kernels/swiglu.h"

#include <algorithm>
#include <type_traits>

#include "kernels/norm_swiglu_common.cuh"

namespace dspine::kernels {
namespace {

using detail::load_pack;
using detail::Pack;
using detail::pack_from_floats;
using detail::sigmoid;
using detail::swiglu_value;
using detail::store_pack;
using detail::to_float;

constexpr int kThreads = 256;
// One 16-byte pack per operand per thread, 8 blocks of 256 threads per SM (32 registers): on an
// H200 at 16384 x 12288 bf16 this reached 102% (forward) and 101% (backward) of the copy
// bandwidth, against 92% for 2 packs per thread at 4 or 3 blocks per SM, whose 64-bit loop
// bookkeeping needed 60-80 registers and so left fewer bytes in flight per SM.
constexpr int kBlocksPerSm = 8;
constexpr int64_t kMaxGridY = 65535;
// The x grid does not loop: 2^31 − 1 blocks of 256 packs cover more columns than any tensor that
// fits in device memory (5.5e11 elements even unvectorised).
constexpr int64_t kMaxGridX = 0x7fffffff;

// Thread (x, y) handles pack x of rows y, y + gridDim.y, ...: columns (in packs) come from the
// x grid, rows from the y grid, which loops when there are more rows than it holds.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    swiglu_forward_kernel(const T* __restrict__ gate, int64_t gate_stride, const T* __restrict__ up,
                          int64_t up_stride, T* __restrict__ out, int64_t out_stride, int64_t rows,
                          int64_t nvec) {
  const int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= nvec) return;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const Pack<T, kVec> g = load_pack<T, kVec>(gate + row * gate_stride + c * kVec);
    const Pack<T, kVec> u = load_pack<T, kVec>(up + row * up_stride + c * kVec);
    float o[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      o[k] = swiglu_value(to_float(g.v[k]), to_float(u.v[k]));
    }
    store_pack(out + row * out_stride + c * kVec, pack_from_floats<T>(o));
  }
}

// The activation's gradients at one element, in fp32, from sig = sigmoid(g).
__device__ __forceinline__ void swiglu_grads(float d, float g, float u, float sig, float& dg,
                                             float& du) {
  dg = d * u * sig * (1.0f + g * (1.0f - sig));
  du = d * g * sig;
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    swiglu_backward_kernel(const T* __restrict__ dout, int64_t dout_stride,
                           const T* __restrict__ gate, int64_t gate_stride,
                           const T* __restrict__ up, int64_t up_stride, T* __restrict__ dgate,
                           int64_t dgate_stride, T* __restrict__ dup, int64_t dup_stride,
                           int64_t rows, int64_t nvec) {
  const int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= nvec) return;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const Pack<T, kVec> d = load_pack<T, kVec>(dout + row * dout_stride + c * kVec);
    const Pack<T, kVec> g = load_pack<T, kVec>(gate + row * gate_stride + c * kVec);
    const Pack<T, kVec> u = load_pack<T, kVec>(up + row * up_stride + c * kVec);
    float dg[kVec], du[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float gv = to_float(g.v[k]);
      swiglu_grads(to_float(d.v[k]), gv, to_float(u.v[k]), sigmoid(gv), dg[k], du[k]);
    }
    store_pack(dgate + row * dgate_stride + c * kVec, pack_from_floats<T>(dg));
    store_pack(dup + row * dup_stride + c * kVec, pack_from_floats<T>(du));
  }
}

// As swiglu_backward_kernel, then the activation silu(gate) * up, rounded as the forward rounds
// it, over the pack of dout it was computed from: one pointer, read before written, so the
// compiler keeps the load ahead of the store.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    swiglu_backward_recompute_kernel(T* dout_act, int64_t dout_act_stride,
                                     const T* __restrict__ gate, int64_t gate_stride,
                                     const T* __restrict__ up, int64_t up_stride,
                                     T* __restrict__ dgate, int64_t dgate_stride,
                                     T* __restrict__ dup, int64_t dup_stride, int64_t rows,
                                     int64_t nvec) {
  const int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= nvec) return;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    T* const d_at = dout_act + row * dout_act_stride + c * kVec;
    const Pack<T, kVec> d = load_pack<T, kVec>(d_at);
    const Pack<T, kVec> g = load_pack<T, kVec>(gate + row * gate_stride + c * kVec);
    const Pack<T, kVec> u = load_pack<T, kVec>(up + row * up_stride + c * kVec);
    float dg[kVec], du[kVec], act[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float gv = to_float(g.v[k]);
      const float uv = to_float(u.v[k]);
      const float sig = sigmoid(gv);
      swiglu_grads(to_float(d.v[k]), gv, uv, sig, dg[k], du[k]);
      act[k] = gv * sig * uv;  // the forward kernel's expression, so the same bits
    }
    store_pack(dgate + row * dgate_stride + c * kVec, pack_from_floats<T>(dg));
    store_pack(dup + row * dup_stride + c * kVec, pack_from_floats<T>(du));
    store_pack(d_at, pack_from_floats<T>(act));
  }
}

// Rows and columns as launched: operands that are all contiguous make one long row.
struct Layout {
  int64_t rows = 0;
  int64_t cols = 0;
  bool vectorised = false;  // every row is whole, 16-byte aligned packs
};

Layout make_layout(Strided2d shape, DType dtype, std::initializer_list<const void*> pointers,
                   std::initializer_list<int64_t> strides) {
  Layout layout{shape.rows, shape.cols, true};
  const int64_t vec = 16 / int64_t(detail::dtype_size(dtype));
  if (shape.cols % vec != 0) layout.vectorised = false;
  for (const void* p : pointers) layout.vectorised = layout.vectorised && detail::aligned16(p);
  bool flat = true;
  for (int64_t s : strides) {
    layout.vectorised = layout.vectorised && s % vec == 0;
    flat = flat && s == shape.cols;
  }
  if (flat) {
    layout.cols *= layout.rows;
    layout.rows = 1;
  }
  return layout;
}

dim3 grid_for(int64_t rows, int64_t nvec) {
  const int64_t x = std::min(kMaxGridX, std::max<int64_t>(1, (nvec + kThreads - 1) / kThreads));
  return dim3(unsigned(x), unsigned(std::min(kMaxGridY, rows)));
}

// Calls launch(vec, rows, packs), vec an integral constant: 16 / sizeof(T) elements per pack when
// the layout allows 16-byte packs, else 1.
template <typename T, typename Launch>
cudaError_t launch_packed(const Layout& layout, Launch&& launch) {
  constexpr int kVec = 16 / sizeof(T);
  if (layout.vectorised) {
    launch(std::integral_constant<int, kVec>{}, layout.rows, layout.cols / kVec);
  } else {
    launch(std::integral_constant<int, 1>{}, layout.rows, layout.cols);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t swiglu_forward(const void* gate, int64_t gate_stride, const void* up, int64_t up_stride,
                           void* out, int64_t out_stride, Strided2d shape, DType dtype,
                           cudaStream_t stream) {
  if (shape.rows == 0 || shape.cols == 0) return cudaSuccess;
  const Layout layout = make_layout(shape, dtype, {gate, up, out}, {gate_stride, up_stride, out_stride});
  return detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch_packed<T>(layout, [&](auto vec, int64_t rows, int64_t packs) {
      swiglu_forward_kernel<T, decltype(vec)::value><<<grid_for(rows, packs), kThreads, 0, stream>>>(
          static_cast<const T*>(gate), gate_stride, static_cast<const T*>(up), up_stride,
          static_cast<T*>(out), out_stride, rows, packs);
    });
  });
}

cudaError_t swiglu_backward(const void* dout, int64_t dout_stride, const void* gate,
                            int64_t gate_stride, const void* up, int64_t up_stride, void* dgate,
                            int64_t dgate_stride, void* dup, int64_t dup_stride, Strided2d shape,
                            DType dtype, cudaStream_t stream) {
  if (shape.rows == 0 || shape.cols == 0) return cudaSuccess;
  const Layout layout = make_layout(shape, dtype, {dout, gate, up, dgate, dup},
                                    {dout_stride, gate_stride, up_stride, dgate_stride, dup_stride});
  return detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch_packed<T>(layout, [&](auto vec, int64_t rows, int64_t packs) {
      swiglu_backward_kernel<T, decltype(vec)::value><<<grid_for(rows, packs), kThreads, 0, stream>>>(
          static_cast<const T*>(dout), dout_stride, static_cast<const T*>(gate), gate_stride,
          static_cast<const T*>(up), up_stride, static_cast<T*>(dgate), dgate_stride,
          static_cast<T*>(dup), dup_stride, rows, packs);
    });
  });
}

cudaError_t swiglu_backward_recompute(void* dout_act, int64_t dout_act_stride, const void* gate,
                                      int64_t gate_stride, const void* up, int64_t up_stride,
                                      void* dgate, int64_t dgate_stride, void* dup,
                                      int64_t dup_stride, Strided2d shape, DType dtype,
                                      cudaStream_t stream) {
  if (shape.rows == 0 || shape.cols == 0) return cudaSuccess;
  const Layout layout =
      make_layout(shape, dtype, {dout_act, gate, up, dgate, dup},
                  {dout_act_stride, gate_stride, up_stride, dgate_stride, dup_stride});
  return detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch_packed<T>(layout, [&](auto vec, int64_t rows, int64_t packs) {
      swiglu_backward_recompute_kernel<T, decltype(vec)::value>
          <<<grid_for(rows, packs), kThreads, 0, stream>>>(
              static_cast<T*>(dout_act), dout_act_stride, static_cast<const T*>(gate),
              gate_stride, static_cast<const T*>(up), up_stride, static_cast<T*>(dgate),
              dgate_stride, static_cast<T*>(dup), dup_stride, rows, packs);
    });
  });
}

}  // namespace dspine::kernels
