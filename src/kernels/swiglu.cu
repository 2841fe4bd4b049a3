#include "kernels/swiglu.h"

#include <algorithm>

#include "kernels/norm_swiglu_common.cuh"

namespace dspine::kernels {
namespace {

using detail::from_float;
using detail::load_pack;
using detail::Pack;
using detail::store_pack;
using detail::to_float;

constexpr int kThreads = 256;
// Packs per thread, all loaded before the first use. With 4, the bf16 backward took 138
// registers (one 256-thread block per SM) and reached 45% of copy bandwidth on an H200; 2 packs
// and a register cap keep 4 (forward) or 3 (backward, which spills at 4) blocks per SM resident.
constexpr int kUnroll = 2;
constexpr int kForwardBlocksPerSm = 4;
constexpr int kBackwardBlocksPerSm = 3;
constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kMaxGridX = 1 << 30;

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + __expf(-g)); }

// Rows come from blockIdx.y, columns (in packs) from blockIdx.x; both loop, so any shape fits in
// the grid limits.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads, kForwardBlocksPerSm)
    swiglu_forward_kernel(const T* __restrict__ gate, int64_t gate_stride, const T* __restrict__ up,
                          int64_t up_stride, T* __restrict__ out, int64_t out_stride, int64_t rows,
                          int64_t nvec) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x * kUnroll;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const T* g_row = gate + row * gate_stride;
    const T* u_row = up + row * up_stride;
    T* o_row = out + row * out_stride;
    for (int64_t first = int64_t(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x; first < nvec;
         first += step) {
      Pack<T, kVec> g[kUnroll], u[kUnroll];
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) {
        const int64_t c = first + int64_t(i) * blockDim.x;
        if (c < nvec) {
          g[i] = load_pack<T, kVec>(g_row + c * kVec);
          u[i] = load_pack<T, kVec>(u_row + c * kVec);
        }
      }
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) {
        const int64_t c = first + int64_t(i) * blockDim.x;
        if (c < nvec) {
          Pack<T, kVec> o;
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
            const float gv = to_float(g[i].v[k]);
            o.v[k] = from_float<T>(gv * sigmoid(gv) * to_float(u[i].v[k]));
          }
          store_pack(o_row + c * kVec, o);
        }
      }
    }
  }
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads, kBackwardBlocksPerSm)
    swiglu_backward_kernel(const T* __restrict__ dout, int64_t dout_stride,
                           const T* __restrict__ gate, int64_t gate_stride,
                           const T* __restrict__ up, int64_t up_stride, T* __restrict__ dgate,
                           int64_t dgate_stride, T* __restrict__ dup, int64_t dup_stride,
                           int64_t rows, int64_t nvec) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x * kUnroll;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const T* d_row = dout + row * dout_stride;
    const T* g_row = gate + row * gate_stride;
    const T* u_row = up + row * up_stride;
    T* dg_row = dgate + row * dgate_stride;
    T* du_row = dup + row * dup_stride;
    for (int64_t first = int64_t(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x; first < nvec;
         first += step) {
      Pack<T, kVec> d[kUnroll], g[kUnroll], u[kUnroll];
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) {
        const int64_t c = first + int64_t(i) * blockDim.x;
        if (c < nvec) {
          d[i] = load_pack<T, kVec>(d_row + c * kVec);
          g[i] = load_pack<T, kVec>(g_row + c * kVec);
          u[i] = load_pack<T, kVec>(u_row + c * kVec);
        }
      }
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) {
        const int64_t c = first + int64_t(i) * blockDim.x;
        if (c < nvec) {
          Pack<T, kVec> dg, du;
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
            const float gv = to_float(g[i].v[k]);
            const float dv = to_float(d[i].v[k]);
            const float sig = sigmoid(gv);
            const float silu = gv * sig;
            dg.v[k] = from_float<T>(dv * to_float(u[i].v[k]) * sig * (1.0f + gv * (1.0f - sig)));
            du.v[k] = from_float<T>(dv * silu);
          }
          store_pack(dg_row + c * kVec, dg);
          store_pack(du_row + c * kVec, du);
        }
      }
    }
  }
}

struct Layout {
  int64_t rows = 0;
  int64_t cols = 0;
  bool vectorised = false;
  bool flat = false;  // every operand contiguous: one long row
};

Layout make_layout(Strided2d shape, DType dtype, std::initializer_list<const void*> pointers,
                   std::initializer_list<int64_t> strides) {
  Layout layout{shape.rows, shape.cols, true, true};
  const int64_t vec = 16 / int64_t(detail::dtype_size(dtype));
  if (shape.cols % vec != 0) layout.vectorised = false;
  for (const void* p : pointers) layout.vectorised = layout.vectorised && detail::aligned16(p);
  for (int64_t s : strides) {
    layout.vectorised = layout.vectorised && s % vec == 0;
    layout.flat = layout.flat && s == shape.cols;
  }
  return layout;
}

dim3 grid_for(int64_t rows, int64_t nvec) {
  const int64_t per_block = int64_t(kThreads) * kUnroll;
  const int64_t x = std::min(kMaxGridX, std::max<int64_t>(1, (nvec + per_block - 1) / per_block));
  return dim3(unsigned(x), unsigned(std::min(kMaxGridY, rows)));
}

}  // namespace

cudaError_t swiglu_forward(const void* gate, int64_t gate_stride, const void* up, int64_t up_stride,
                           void* out, int64_t out_stride, Strided2d shape, DType dtype,
                           cudaStream_t stream) {
  if (shape.rows == 0 || shape.cols == 0) return cudaSuccess;
  Layout layout = make_layout(shape, dtype, {gate, up, out}, {gate_stride, up_stride, out_stride});
  if (layout.flat) {
    layout.cols *= layout.rows;
    layout.rows = 1;
  }
  return detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = 16 / sizeof(T);
    const auto* g = static_cast<const T*>(gate);
    const auto* u = static_cast<const T*>(up);
    auto* o = static_cast<T*>(out);
    if (layout.vectorised) {
      const int64_t nvec = layout.cols / kVec;
      swiglu_forward_kernel<T, kVec><<<grid_for(layout.rows, nvec), kThreads, 0, stream>>>(
          g, gate_stride, u, up_stride, o, out_stride, layout.rows, nvec);
    } else {
      swiglu_forward_kernel<T, 1><<<grid_for(layout.rows, layout.cols), kThreads, 0, stream>>>(
          g, gate_stride, u, up_stride, o, out_stride, layout.rows, layout.cols);
    }
    return cudaGetLastError();
  });
}

cudaError_t swiglu_backward(const void* dout, int64_t dout_stride, const void* gate,
                            int64_t gate_stride, const void* up, int64_t up_stride, void* dgate,
                            int64_t dgate_stride, void* dup, int64_t dup_stride, Strided2d shape,
                            DType dtype, cudaStream_t stream) {
  if (shape.rows == 0 || shape.cols == 0) return cudaSuccess;
  Layout layout = make_layout(shape, dtype, {dout, gate, up, dgate, dup},
                              {dout_stride, gate_stride, up_stride, dgate_stride, dup_stride});
  if (layout.flat) {
    layout.cols *= layout.rows;
    layout.rows = 1;
  }
  return detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = 16 / sizeof(T);
    const auto* d = static_cast<const T*>(dout);
    const auto* g = static_cast<const T*>(gate);
    const auto* u = static_cast<const T*>(up);
    auto* dg = static_cast<T*>(dgate);
    auto* du = static_cast<T*>(dup);
    if (layout.vectorised) {
      const int64_t nvec = layout.cols / kVec;
      swiglu_backward_kernel<T, kVec><<<grid_for(layout.rows, nvec), kThreads, 0, stream>>>(
          d, dout_stride, g, gate_stride, u, up_stride, dg, dgate_stride, du, dup_stride,
          layout.rows, nvec);
    } else {
      swiglu_backward_kernel<T, 1><<<grid_for(layout.rows, layout.cols), kThreads, 0, stream>>>(
          d, dout_stride, g, gate_stride, u, up_stride, dg, dgate_stride, du, dup_stride,
          layout.rows, layout.cols);
    }
    return cudaGetLastError();
  });
}

}  // namespace dspine::kernels
