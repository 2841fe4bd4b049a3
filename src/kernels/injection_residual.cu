#include "kernels/injection_residual.h"

#include "kernels/norm_swiglu_common.cuh"

namespace dspine::kernels {
namespace {

using detail::block_sum;
using detail::from_float;
using detail::load_pack;
using detail::Pack;
using detail::store_pack;
using detail::to_float;

constexpr int kMaxThreads = 256;
constexpr int kItemChoices[] = {1, 2, 4, 8};

// One block per row of h; each thread keeps kItems 16-byte packs of the row in registers.
template <typename T, int kItems>
struct RowPacks {
  static constexpr int kVec = 16 / sizeof(T);
  Pack<T, kVec> v[kItems];

  __device__ void load(const T* row, int nvec) {
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int p = threadIdx.x + i * blockDim.x;
      if (p < nvec) v[i] = load_pack<T, kVec>(row + int64_t(p) * kVec);
    }
  }
};

// The delta row paired with h's `row` (h's rows without the skipped ones, in order).
__device__ __forceinline__ int64_t delta_row(int64_t row, const InjectionRows& s) {
  if (!s.skip_first) return row;
  return row / s.positions * (s.positions - 1) + row % s.positions - 1;
}

// The readout rows on the device (InjectionReadout with typed pointers); width 0 when absent.
template <typename T>
struct ReadoutRows {
  int nvec = 0;  // 16-byte packs per row
  const T* r = nullptr;
  const T* delta_r = nullptr;
  T* out_r = nullptr;
  const T* grad_r = nullptr;
  T* grad_delta_r = nullptr;
};

template <typename T>
ReadoutRows<T> readout_rows(const InjectionReadout* readout) {
  ReadoutRows<T> rows;
  if (readout == nullptr) return rows;
  rows.nvec = int(readout->width * int64_t(sizeof(T)) / 16);
  rows.r = static_cast<const T*>(readout->r);
  rows.delta_r = static_cast<const T*>(readout->delta_r);
  rows.out_r = static_cast<T*>(readout->out_r);
  rows.grad_r = static_cast<const T*>(readout->grad_r);
  rows.grad_delta_r = static_cast<T*>(readout->grad_delta_r);
  return rows;
}

// out_r = r + rms · delta_r over a row's packs (r alone on skipped rows), rounded once.
template <typename T>
__device__ void write_readout_row(const ReadoutRows<T>& o, int64_t row, int64_t drow, float rms,
                                  bool skipped) {
  constexpr int kVec = 16 / sizeof(T);
  for (int p = threadIdx.x; p < o.nvec; p += blockDim.x) {
    auto y = load_pack<T, kVec>(o.r + row * o.nvec * kVec + int64_t(p) * kVec);
    if (!skipped) {
      const auto d = load_pack<T, kVec>(o.delta_r + drow * o.nvec * kVec + int64_t(p) * kVec);
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        y.v[k] = from_float<T>(to_float(y.v[k]) + rms * to_float(d.v[k]));
    }
    store_pack(o.out_r + row * o.nvec * kVec + int64_t(p) * kVec, y);
  }
}

// This thread's share of Σ grad_r · delta_r over a written row; writes grad_delta_r = rms·grad_r.
template <typename T>
__device__ float readout_gradient_row(const ReadoutRows<T>& o, int64_t row, int64_t drow,
                                      float rms) {
  constexpr int kVec = 16 / sizeof(T);
  float dot = 0.f;
  if (o.grad_r == nullptr) return dot;
  for (int p = threadIdx.x; p < o.nvec; p += blockDim.x) {
    const auto g = load_pack<T, kVec>(o.grad_r + row * o.nvec * kVec + int64_t(p) * kVec);
    const auto d = load_pack<T, kVec>(o.delta_r + drow * o.nvec * kVec + int64_t(p) * kVec);
    Pack<T, kVec> gd;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      dot += to_float(g.v[k]) * to_float(d.v[k]);
      gd.v[k] = from_float<T>(rms * to_float(g.v[k]));
    }
    store_pack(o.grad_delta_r + drow * o.nvec * kVec + int64_t(p) * kVec, gd);
  }
  return dot;
}

template <typename T, int kItems>
__global__ void injection_residual_forward_kernel(const T* __restrict__ h,
                                                  const T* __restrict__ delta, T* __restrict__ out,
                                                  float* __restrict__ rms, InjectionRows s,
                                                  ReadoutRows<T> readout) {
  constexpr int kVec = RowPacks<T, kItems>::kVec;
  __shared__ float scratch[32];
  const int nvec = int(s.hidden / kVec);
  const int64_t row = blockIdx.x;
  RowPacks<T, kItems> x;
  x.load(h + row * s.hidden, nvec);
  const bool skipped = s.skip_first && row % s.positions == 0;
  float sumsq = 0.f;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    if (threadIdx.x + i * blockDim.x < nvec) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) sumsq += to_float(x.v[i].v[k]) * to_float(x.v[i].v[k]);
    }
  }
  // Uniform per block: every thread reaches the block sum or none does.
  const float r = skipped ? 0.f : sqrtf(block_sum(sumsq, scratch) / float(s.hidden));
  if (threadIdx.x == 0) rms[row] = r;
  if (readout.nvec > 0) write_readout_row(readout, row, delta_row(row, s), r, skipped);
  RowPacks<T, kItems> d;
  if (!skipped) d.load(delta + delta_row(row, s) * s.hidden, nvec);
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int p = threadIdx.x + i * blockDim.x;
    if (p >= nvec) continue;
    Pack<T, kVec> y = x.v[i];
    if (!skipped) {
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        y.v[k] = from_float<T>(to_float(x.v[i].v[k]) + r * to_float(d.v[i].v[k]));
    }
    store_pack(out + row * s.hidden + int64_t(p) * kVec, y);
  }
}

template <typename T, int kItems>
__global__ void injection_residual_backward_kernel(const T* __restrict__ grad,
                                                   const T* __restrict__ h,
                                                   const T* __restrict__ delta,
                                                   const float* __restrict__ rms,
                                                   T* __restrict__ grad_h,
                                                   T* __restrict__ grad_delta, InjectionRows s,
                                                   ReadoutRows<T> readout) {
  constexpr int kVec = RowPacks<T, kItems>::kVec;
  __shared__ float scratch[32];
  const int nvec = int(s.hidden / kVec);
  const int64_t row = blockIdx.x;
  RowPacks<T, kItems> g;
  g.load(grad + row * s.hidden, nvec);
  if (s.skip_first && row % s.positions == 0) {
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int p = threadIdx.x + i * blockDim.x;
      if (p < nvec) store_pack(grad_h + row * s.hidden + int64_t(p) * kVec, g.v[i]);
    }
    return;
  }
  const int64_t drow = delta_row(row, s);
  RowPacks<T, kItems> x, d;
  x.load(h + row * s.hidden, nvec);
  d.load(delta + drow * s.hidden, nvec);
  float dot = 0.f;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    if (threadIdx.x + i * blockDim.x < nvec) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) dot += to_float(g.v[i].v[k]) * to_float(d.v[i].v[k]);
    }
  }
  const float r = rms[row];
  if (readout.nvec > 0) dot += readout_gradient_row(readout, row, drow, r);
  // d rms / d h = h / (H · rms); at rms = 0 the norm's subgradient 0, as ATen's norm backward.
  const float c = r > 0.f ? block_sum(dot, scratch) / (float(s.hidden) * r) : 0.f;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int p = threadIdx.x + i * blockDim.x;
    if (p >= nvec) continue;
    Pack<T, kVec> gh, gd;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float gk = to_float(g.v[i].v[k]);
      gh.v[k] = from_float<T>(gk + c * to_float(x.v[i].v[k]));
      gd.v[k] = from_float<T>(r * gk);
    }
    store_pack(grad_h + row * s.hidden + int64_t(p) * kVec, gh);
    store_pack(grad_delta + drow * s.hidden + int64_t(p) * kVec, gd);
  }
}

// 16-byte packs in a row of `hidden` elements (rounded down).
int64_t packs_per_row(int64_t hidden, DType type) {
  return hidden * int64_t(detail::dtype_size(type)) / 16;
}

// Packs per thread: the fewest that keep a row within kMaxThreads threads; 0 when none does.
int items_for(int64_t nvec) {
  for (int items : kItemChoices) {
    if ((nvec + items - 1) / items <= kMaxThreads) return items;
  }
  return 0;
}

template <typename T, typename F>
cudaError_t with_items(int items, F&& f) {
  switch (items) {
    case 1:
      return f(detail::TypeTag<T>{}, std::integral_constant<int, 1>{});
    case 2:
      return f(detail::TypeTag<T>{}, std::integral_constant<int, 2>{});
    case 4:
      return f(detail::TypeTag<T>{}, std::integral_constant<int, 4>{});
    case 8:
      return f(detail::TypeTag<T>{}, std::integral_constant<int, 8>{});
  }
  return cudaErrorInvalidValue;
}

// Calls f(TypeTag<T>, integral_constant<kItems>) and returns the launch error.
template <typename F>
cudaError_t dispatch(const InjectionRows& s, F&& f) {
  if (!injection_residual_supported(s.hidden, s.type) || s.positions < 1 ||
      s.rows % s.positions != 0 || (s.skip_first && s.positions < 2)) {
    return cudaErrorInvalidValue;
  }
  return detail::dispatch_dtype(s.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return with_items<T>(items_for(packs_per_row(s.hidden, s.type)), f);
  });
}

// A readout's width and pointers the kernels take (null: none).
cudaError_t check_readout(const InjectionReadout* readout, DType type) {
  if (readout == nullptr) return cudaSuccess;
  if (!injection_readout_supported(readout->width, type)) return cudaErrorInvalidValue;
  for (const void* p : {readout->r, readout->delta_r, static_cast<const void*>(readout->out_r),
                        readout->grad_r, static_cast<const void*>(readout->grad_delta_r)}) {
    if (p != nullptr && !detail::aligned16(p)) return cudaErrorMisalignedAddress;
  }
  return cudaSuccess;
}

int threads_for(const InjectionRows& s) {
  const int64_t nvec = packs_per_row(s.hidden, s.type);
  const int items = items_for(nvec);
  return int((nvec + items - 1) / items + 31) / 32 * 32;
}

}  // namespace

bool injection_readout_supported(int64_t width, DType type) {
  return width > 0 && width * int64_t(detail::dtype_size(type)) % 16 == 0;
}

bool injection_residual_supported(int64_t hidden, DType type) {
  const int64_t bytes = hidden * int64_t(detail::dtype_size(type));
  return hidden > 0 && bytes % 16 == 0 && items_for(bytes / 16) > 0;
}

cudaError_t injection_residual_forward(const void* h, const void* delta, void* out, float* rms,
                                       const InjectionRows& s, cudaStream_t stream,
                                       const InjectionReadout* readout) {
  if (s.rows == 0) return cudaSuccess;
  if (!detail::aligned16(h) || !detail::aligned16(delta) || !detail::aligned16(out)) {
    return cudaErrorMisalignedAddress;
  }
  if (readout != nullptr && (readout->r == nullptr || readout->delta_r == nullptr ||
                             readout->out_r == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (const cudaError_t e = check_readout(readout, s.type); e != cudaSuccess) return e;
  return dispatch(s, [&](auto tag, auto items) {
    using T = typename decltype(tag)::type;
    injection_residual_forward_kernel<T, decltype(items)::value>
        <<<unsigned(s.rows), threads_for(s), 0, stream>>>(static_cast<const T*>(h),
                                                          static_cast<const T*>(delta),
                                                          static_cast<T*>(out), rms, s,
                                                          readout_rows<T>(readout));
    return cudaGetLastError();
  });
}

cudaError_t injection_residual_backward(const void* grad, const void* h, const void* delta,
                                        const float* rms, void* grad_h, void* grad_delta,
                                        const InjectionRows& s, cudaStream_t stream,
                                        const InjectionReadout* readout) {
  if (s.rows == 0) return cudaSuccess;
  if (readout != nullptr && readout->grad_r != nullptr &&
      (readout->delta_r == nullptr || readout->grad_delta_r == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (const cudaError_t e = check_readout(readout, s.type); e != cudaSuccess) return e;
  for (const void* p : {grad, h, delta, static_cast<const void*>(grad_h),
                        static_cast<const void*>(grad_delta)}) {
    if (!detail::aligned16(p)) return cudaErrorMisalignedAddress;
  }
  return dispatch(s, [&](auto tag, auto items) {
    using T = typename decltype(tag)::type;
    injection_residual_backward_kernel<T, decltype(items)::value>
        <<<unsigned(s.rows), threads_for(s), 0, stream>>>(
            static_cast<const T*>(grad), static_cast<const T*>(h), static_cast<const T*>(delta),
            rms, static_cast<T*>(grad_h), static_cast<T*>(grad_delta), s,
            readout_rows<T>(readout));
    return cudaGetLastError();
  });
}

}  // namespace dspine::kernels
