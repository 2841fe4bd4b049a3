// See wgmma_probe.h. One warpgroup computes both products exactly as the block attention's
// wgmma forward does for one key tile, from plain row-major inputs.
#include "kernels/wgmma_probe.h"

#include <cuda_bf16.h>

#include "kernels/wgmma.cuh"

namespace dspine::kernels {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kDim = 128, kKeys = 64;

// The A fragment (mma.sync m16n8k16 layout) of columns 16·step.. of a row-major [64, cols] matrix.
__device__ void a_fragment(uint32_t (&a)[4], const bf16* m, int cols, int step) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = 16 * warp + lane / 4, col = 16 * step + 2 * (lane % 4);
  auto pair = [&](int r, int c) { return *reinterpret_cast<const uint32_t*>(m + r * cols + c); };
  a[0] = pair(row, col);
  a[1] = pair(row + 8, col);
  a[2] = pair(row, col + 8);
  a[3] = pair(row + 8, col + 8);
}

// Writes accumulator d (64 × n, C fragments per 8-column chunk) to a row-major fp32 matrix.
template <int N>
__device__ void store_accumulator(float* out, const float (&d)[N / 2]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const int row = 16 * warp + lane / 4 + (i % 4 >= 2 ? 8 : 0);
    const int col = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
    out[row * N + col] = d[i];
  }
}

__global__ void __launch_bounds__(128) wgmma_probe_kernel(const bf16* q, const bf16* k, const bf16* p,
                                                         const bf16* v, float* s_out, float* o_out) {
#ifdef DSPINE_WGMMA
  __shared__ __align__(wgmma::kTileAlignment) unsigned char tiles[2 * kKeys * kDim * 2];
  unsigned char* k_tile = tiles;
  unsigned char* v_tile = tiles + kKeys * kDim * 2;
  for (int i = threadIdx.x; i < kKeys * (kDim / 8); i += blockDim.x) {
    const int r = i / (kDim / 8), c = i % (kDim / 8);
    const int at = wgmma::swizzled_offset<kKeys>(r, c);
    *reinterpret_cast<uint4*>(k_tile + at) = *reinterpret_cast<const uint4*>(k + r * kDim + 8 * c);
    *reinterpret_cast<uint4*>(v_tile + at) = *reinterpret_cast<const uint4*>(v + r * kDim + 8 * c);
  }
  wgmma::fence_shared();
  __syncthreads();
  const uint32_t k_address = static_cast<uint32_t>(__cvta_generic_to_shared(k_tile));
  const uint32_t v_address = static_cast<uint32_t>(__cvta_generic_to_shared(v_tile));

  float s[kKeys / 2];
  uint32_t a[kDim / 16][4];
#pragma unroll
  for (int step = 0; step < kDim / 16; ++step) a_fragment(a[step], q, kDim, step);
  wgmma::fence();
#pragma unroll
  for (int step = 0; step < kDim / 16; ++step) {
    wgmma::mma_m64n64k16(s, a[step], wgmma::k_major<kKeys>(k_address, step), step > 0);
  }
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::pin(s);
  store_accumulator<kKeys>(s_out, s);

  float o[kDim / 2];
  uint32_t pa[kKeys / 16][4];
#pragma unroll
  for (int step = 0; step < kKeys / 16; ++step) a_fragment(pa[step], p, kKeys, step);
  wgmma::fence();
#pragma unroll
  for (int step = 0; step < kKeys / 16; ++step) {
    wgmma::mma_m64n128k16(o, pa[step], wgmma::mn_major<kKeys>(v_address, step), step > 0);
  }
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::pin(o);
  store_accumulator<kDim>(o_out, o);
#endif
}

}  // namespace

bool wgmma_available() {
#if defined(DSPINE_HAS_SM90A)
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major == 9 && minor == 0;
#else
  return false;
#endif
}

cudaError_t wgmma_probe(const void* q, const void* k, const void* p, const void* v, float* s,
                        float* o, cudaStream_t stream) {
  if (!wgmma_available()) return cudaErrorNotSupported;
  wgmma_probe_kernel<<<1, 128, 0, stream>>>(
      static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(p),
      static_cast<const bf16*>(v), s, o);
  return cudaGetLastError();
}

}  // namespace dspine::kernels
