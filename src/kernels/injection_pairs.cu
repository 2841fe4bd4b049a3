// Elementwise copies and sums in 16-byte packs, one thread per pack of an output row; see
// injection_pairs.h for what each row holds.
#include "kernels/injection_pairs.h"

#include "kernels/norm_swiglu_common.cuh"

namespace dspine::kernels {
namespace {

using detail::from_float;
using detail::load_pack;
using detail::Pack;
using detail::store_pack;
using detail::to_float;

constexpr int kThreads = 256;

// Thread i: pack i % packs of proposal row i / packs (block b, proposal k).
template <typename T>
__global__ void injection_pairs_forward_kernel(const T* __restrict__ features,
                                               const T* __restrict__ anchor,
                                               T* __restrict__ receiver,
                                               T* __restrict__ predecessor, int64_t packs,
                                               int64_t positions, int64_t total) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t row = i / packs, p = i % packs;
  const int64_t b = row / (positions - 1), k = row % (positions - 1);
  const int64_t rank = packs * kVec;
  const T* f = features + b * positions * rank + p * kVec;
  store_pack(receiver + row * rank + p * kVec, load_pack<T, kVec>(f + (k + 1) * rank));
  const T* pred = k == 0 ? anchor + b * rank + p * kVec : f + k * rank;
  store_pack(predecessor + row * rank + p * kVec, load_pack<T, kVec>(pred));
}

// Thread i: pack i % packs of feature row i / packs (block b, position j).
template <typename T>
__global__ void injection_pairs_backward_kernel(const T* __restrict__ grad_receiver,
                                                const T* __restrict__ grad_predecessor,
                                                T* __restrict__ grad_features,
                                                T* __restrict__ grad_anchor, int64_t packs,
                                                int64_t positions, int64_t total) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t row = i / packs, p = i % packs;
  const int64_t b = row / positions, j = row % positions;
  const int64_t rank = packs * kVec, proposals = positions - 1;
  const int64_t first = b * proposals * rank + p * kVec;  // proposal 0 of block b, this pack
  float sum[kVec] = {};
  if (j > 0) {
    const Pack<T, kVec> r = load_pack<T, kVec>(grad_receiver + first + (j - 1) * rank);
#pragma unroll
    for (int e = 0; e < kVec; ++e) sum[e] = to_float(r.v[e]);
  }
  if (j > 0 && j < proposals) {
    const Pack<T, kVec> q = load_pack<T, kVec>(grad_predecessor + first + j * rank);
#pragma unroll
    for (int e = 0; e < kVec; ++e) sum[e] += to_float(q.v[e]);
  }
  Pack<T, kVec> out;
#pragma unroll
  for (int e = 0; e < kVec; ++e) out.v[e] = from_float<T>(sum[e]);
  store_pack(grad_features + row * rank + p * kVec, out);
  if (j == 0) {
    store_pack(grad_anchor + b * rank + p * kVec, load_pack<T, kVec>(grad_predecessor + first));
  }
}

bool shape_ok(const InjectionPairShape& s) {
  return s.blocks >= 0 && s.positions >= 2 && injection_pairs_supported(s.rank, s.type);
}

unsigned grid_for(int64_t total) { return unsigned((total + kThreads - 1) / kThreads); }

}  // namespace

bool injection_pairs_supported(int64_t rank, DType type) {
  return rank > 0 && rank * int64_t(detail::dtype_size(type)) % 16 == 0;
}

cudaError_t injection_pairs_forward(const void* features, const void* anchor, void* receiver,
                                    void* predecessor, const InjectionPairShape& s,
                                    cudaStream_t stream) {
  if (!shape_ok(s)) return cudaErrorInvalidValue;
  if (s.blocks == 0) return cudaSuccess;
  for (const void* p : {features, anchor, static_cast<const void*>(receiver),
                        static_cast<const void*>(predecessor)}) {
    if (!detail::aligned16(p)) return cudaErrorMisalignedAddress;
  }
  return detail::dispatch_dtype(s.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t packs = s.rank * int64_t(sizeof(T)) / 16;
    const int64_t total = s.blocks * (s.positions - 1) * packs;
    injection_pairs_forward_kernel<T><<<grid_for(total), kThreads, 0, stream>>>(
        static_cast<const T*>(features), static_cast<const T*>(anchor), static_cast<T*>(receiver),
        static_cast<T*>(predecessor), packs, s.positions, total);
    return cudaGetLastError();
  });
}

cudaError_t injection_pairs_backward(const void* grad_receiver, const void* grad_predecessor,
                                     void* grad_features, void* grad_anchor,
                                     const InjectionPairShape& s, cudaStream_t stream) {
  if (!shape_ok(s)) return cudaErrorInvalidValue;
  if (s.blocks == 0) return cudaSuccess;
  for (const void* p : {grad_receiver, grad_predecessor, static_cast<const void*>(grad_features),
                        static_cast<const void*>(grad_anchor)}) {
    if (!detail::aligned16(p)) return cudaErrorMisalignedAddress;
  }
  return detail::dispatch_dtype(s.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t packs = s.rank * int64_t(sizeof(T)) / 16;
    const int64_t total = s.blocks * s.positions * packs;
    injection_pairs_backward_kernel<T><<<grid_for(total), kThreads, 0, stream>>>(
        static_cast<const T*>(grad_receiver), static_cast<const T*>(grad_predecessor),
        static_cast<T*>(grad_features), static_cast<T*>(grad_anchor), packs, s.positions, total);
    return cudaGetLastError();
  });
}

}  // namespace dspine::kernels
