// The bf16 GEMM of gemm_sm90.h. One CTA per SM (persistent), three warpgroups: warpgroup 0's first
// thread issues the TMA copies of A and B tiles into a ring of kStages stages and gives up most of
// its registers; warpgroups 1 and 2 each multiply 64 rows of the 128-row A tile by the 256-row B
// tile (wgmma m64n256k16, both operands from shared memory, 128 fp32 accumulators per thread),
// keeping one k-tile's products in flight, and release a stage to the producer once the products
// that read it have completed. A tile's epilogue rounds the accumulators (plus the residual) to
// bf16 and stores them directly, while the producer already fills the ring for the next tile.
#include "kernels/gemm_sm90.h"

#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/tma.cuh"
#include "kernels/wgmma.cuh"

namespace dspine::kernels {
namespace {

constexpr int kTileM = 128, kTileN = 256, kTileK = 64, kStages = 4;
constexpr int kBytesA = kTileM * kTileK * 2, kBytesB = kTileN * kTileK * 2;
constexpr int kStageBytes = kBytesA + kBytesB;
// The ring, plus slack to start it on the 1024-byte boundary the swizzle needs.
constexpr int kSharedBytes = kStages * kStageBytes + wgmma::kTileAlignment;
constexpr int kThreads = 384;
// Tile rows walked together: the CTAs running at once share this group's B tiles in L2.
constexpr int kGroupRows = 8;

// Tile t's (row, column) in the grouped order.
__device__ __forceinline__ void tile_position(int t, int tiles_m, int tiles_n, int& tm, int& tn) {
  const int per_group = kGroupRows * tiles_n;
  const int first = t / per_group * kGroupRows;
  const int rows = min(tiles_m - first, kGroupRows);
  const int r = t % per_group;
  tm = first + r % rows;
  tn = r / rows;
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Accumulator pair (d[4j + 2h], d[4j + 2h + 1]) of a consumer thread lies at row
// warp·16 + lane/4 + 8h of its 64 rows and columns 8j + 2·(lane mod 4) + {0, 1}.
__device__ __forceinline__ void store_tile(const float (&d)[128], __nv_bfloat16* c,
                                           const __nv_bfloat16* residual, int row0, int col0,
                                           int m, int n) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int col = col0 + 8 * j;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 8 * h;
      if (row >= m || col >= n) continue;
      const int64_t at = int64_t(row) * n + col;
      float x = d[4 * j + 2 * h], y = d[4 * j + 2 * h + 1];
      if (col + 1 < n) {
        if (residual != nullptr) {
          const float2 r = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(residual + at));
          x += r.x;
          y += r.y;
        }
        *reinterpret_cast<__nv_bfloat162*>(c + at) = __floats2bfloat162_rn(x, y);
      } else {
        if (residual != nullptr) x += __bfloat162float(residual[at]);
        c[at] = __float2bfloat16_rn(x);
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    gemm_bf16_kernel(const __grid_constant__ CUtensorMap map_a,
                     const __grid_constant__ CUtensorMap map_b, __nv_bfloat16* c,
                     const __nv_bfloat16* residual, int m, int n, int k) {
#if defined(DSPINE_WGMMA)
  extern __shared__ uint8_t shared_raw[];
  __shared__ __align__(8) uint64_t full[kStages], empty[kStages];
  const uint32_t ring = (shared_address(shared_raw) + wgmma::kTileAlignment - 1) &
                        ~uint32_t(wgmma::kTileAlignment - 1);
  const int tiles_m = (m + kTileM - 1) / kTileM, tiles_n = (n + kTileN - 1) / kTileN;
  const int tiles = tiles_m * tiles_n, k_tiles = (k + kTileK - 1) / kTileK;
  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      tma::init_barrier(shared_address(&full[s]), 1);   // the producer's byte count
      tma::init_barrier(shared_address(&empty[s]), 2);  // one arrival per consumer warpgroup
    }
    tma::fence_barrier_init();
  }
  __syncthreads();
  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x != 0) return;
    int stage = 0, round = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      int tm, tn;
      tile_position(t, tiles_m, tiles_n, tm, tn);
      for (int kt = 0; kt < k_tiles; ++kt) {
        // A fresh barrier counts as having completed the phase before its first: round 0 waits
        // for nothing.
        tma::wait_barrier(shared_address(&empty[stage]), (round & 1) ^ 1);
        const uint32_t f = shared_address(&full[stage]), a = ring + stage * kStageBytes;
        tma::expect_bytes(f, kStageBytes);  // out-of-range parts arrive zero-filled, counted
        tma::copy_box(a, &map_a, f, kt * kTileK, tm * kTileM, 0, 0);
        tma::copy_box(a + kBytesA, &map_b, f, kt * kTileK, tn * kTileN, 0, 0);
        if (++stage == kStages) stage = 0, ++round;
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int consumer = warpgroup - 1;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const bool releases = warp == 0 && lane == 0;  // the warpgroup's one arrival on `empty`
  int stage = 0, round = 0;
  float d[128];
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    int tm, tn;
    tile_position(t, tiles_m, tiles_n, tm, tn);
    int previous = -1;
    for (int kt = 0; kt < k_tiles; ++kt) {
      tma::wait_barrier(shared_address(&full[stage]), round & 1);
      const uint32_t a = ring + stage * kStageBytes + consumer * 64 * 128;
      const uint32_t b = ring + stage * kStageBytes + kBytesA;
      wgmma::fence();
#pragma unroll
      for (int s = 0; s < kTileK / 16; ++s) {
        wgmma::mma_m64n256k16(d, wgmma::k_major<64>(a, s), wgmma::k_major<kTileN>(b, s),
                              kt > 0 || s > 0);
      }
      wgmma::commit();
      wgmma::wait<1>();  // the previous k-tile's products are done: its stage can be refilled
      wgmma::pin(d);
      if (previous >= 0 && releases) tma::arrive(shared_address(&empty[previous]));
      previous = stage;
      if (++stage == kStages) stage = 0, ++round;
    }
    wgmma::wait<0>();
    wgmma::pin(d);
    if (previous >= 0 && releases) tma::arrive(shared_address(&empty[previous]));
    store_tile(d, c, residual, tm * kTileM + consumer * 64 + warp * 16 + lane / 4,
               tn * kTileN + (lane % 4) * 2, m, n);
  }
#endif
}

// A K-major [rows, K] bf16 operand, copied in [box_rows, 64] tiles in the 128-byte swizzle.
cudaError_t operand_map(CUtensorMap* map, const void* base, int64_t rows, int64_t k,
                        uint32_t box_rows) {
  const uint64_t row_bytes = uint64_t(k) * 2;
  const uint64_t dims[4] = {uint64_t(k), uint64_t(rows), 1, 1};
  const uint64_t strides[3] = {row_bytes, row_bytes * rows, row_bytes * rows};
  const uint32_t box[4] = {kTileK, box_rows, 1, 1};
  return tma::encode_bf16_map(map, base, dims, strides, box);
}

bool aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// The device's compute capability major and SM count, read once per device.
struct DeviceTraits {
  int major = 0, sms = 0;
};
DeviceTraits device_traits() {
  static DeviceTraits traits[64];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return {};
  DeviceTraits& t = traits[device];
  if (t.sms == 0) {
    cudaDeviceGetAttribute(&t.major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&t.sms, cudaDevAttrMultiProcessorCount, device);
  }
  return t;
}

}  // namespace

bool gemm_bf16_supported(const void* a, const void* b, const void* c, const void* residual,
                         int64_t m, int64_t n, int64_t k) {
  const int64_t limit = int64_t(1) << 31;
  return m >= 1 && n >= 1 && k >= 1 && m < limit && n < limit && k < limit && k % 8 == 0 &&
         n % 2 == 0 && aligned(a, 16) && aligned(b, 16) && aligned(c, 4) &&
         (residual == nullptr || aligned(residual, 4)) && device_traits().major == 9;
}

cudaError_t gemm_bf16(const void* a, const void* b, void* c, const void* residual, int64_t m,
                      int64_t n, int64_t k, cudaStream_t stream) {
  if (!gemm_bf16_supported(a, b, c, residual, m, n, k)) return cudaErrorNotSupported;
  CUtensorMap map_a, map_b;
  if (cudaError_t e = operand_map(&map_a, a, m, k, kTileM); e != cudaSuccess) return e;
  if (cudaError_t e = operand_map(&map_b, b, n, k, kTileN); e != cudaSuccess) return e;
  static const cudaError_t configured = cudaFuncSetAttribute(
      gemm_bf16_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes);
  if (configured != cudaSuccess) return configured;
  const int64_t tiles = ((m + kTileM - 1) / kTileM) * ((n + kTileN - 1) / kTileN);
  const int grid = static_cast<int>(std::min<int64_t>(device_traits().sms, tiles));
  gemm_bf16_kernel<<<grid, kThreads, kSharedBytes, stream>>>(
      map_a, map_b, static_cast<__nv_bfloat16*>(c), static_cast<const __nv_bfloat16*>(residual),
      static_cast<int>(m), static_cast<int>(n), static_cast<int>(k));
  return cudaGetLastError();
}

}  // namespace dspine::kernels
