// The bf16 GEMM of gemm_sm90.h. One CTA per SM (persistent), three warpgroups: warpgroup 0's first
// thread issues the TMA copies of A and B tiles into a ring of kStages stages and gives up most of
// its registers; warpgroups 1 and 2 each multiply 64 rows of the 128-row A tile by the 256-row B
// tile (wgmma m64n256k16, both operands from shared memory, 128 fp32 accumulators per thread),
// keeping one k-tile's products in flight, and release a stage to the producer once the products
// that read it have completed. A tile's epilogue rounds the accumulators (plus the residual) to
// bf16 into a staging tile in shared memory, which one thread stores with TMA while the warpgroup
// goes on to the next tile's products (the SwiGLU epilogue stores directly); meanwhile the
// producer already fills the ring for the next tile.
#include "kernels/gemm_sm90.h"

#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/norm_swiglu_common.cuh"
#include "kernels/tma.cuh"
#include "kernels/wgmma.cuh"
#include "kernels/wgmma_probe.h"

namespace dspine::kernels {
namespace {

constexpr int kTileM = 128, kTileN = 256, kTileK = 64;
constexpr int kBytesA = kTileM * kTileK * 2, kBytesB = kTileN * kTileK * 2;
constexpr int kStageBytes = kBytesA + kBytesB;
constexpr int kThreads = 384;
// A consumer warpgroup's 64 × 256 output tile staged in shared memory as four 64 × 64 boxes.
constexpr int kBoxColumns = 64, kStagingBytes = 64 * kTileN * 2;

// Shared memory of a kernel form: the ring (three stages beside the two staging tiles, which the
// 227 KB of an SM leave room for; four for the SwiGLU form, which stores directly), plus slack to
// start it on the 1024-byte boundary the swizzle needs.
template <bool kSwiGLU>
struct SharedLayout {
  static constexpr int kStages = kSwiGLU ? 4 : 3;
  static constexpr int kStaging = kSwiGLU ? 0 : 2 * kStagingBytes;
  static constexpr int kBytes = kStages * kStageBytes + kStaging + wgmma::kTileAlignment;
};
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

// The SwiGLU epilogue's tile: accumulator columns 0–127 hold the gate's columns col0 + 8j + …,
// 128–255 the up projection's same columns (d[4j + …] and d[4(j + 16) + …]). Writes both, rounded,
// into gate_up [m, 2n] and silu(gate)·up of the rounded values into act [m, n].
__device__ __forceinline__ void store_swiglu_tile(const float (&d)[128], __nv_bfloat16* gate_up,
                                                  __nv_bfloat16* act, int row0, int col0, int m,
                                                  int n) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int col = col0 + 8 * j;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 8 * h;
      if (row >= m || col >= n) continue;  // n is even: a pair is whole
      const __nv_bfloat162 g = __floats2bfloat162_rn(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
      const __nv_bfloat162 u =
          __floats2bfloat162_rn(d[4 * (j + 16) + 2 * h], d[4 * (j + 16) + 2 * h + 1]);
      const int64_t at = int64_t(row) * 2 * n + col;
      *reinterpret_cast<__nv_bfloat162*>(gate_up + at) = g;
      *reinterpret_cast<__nv_bfloat162*>(gate_up + at + n) = u;
      const float2 gf = __bfloat1622float2(g), uf = __bfloat1622float2(u);
      *reinterpret_cast<__nv_bfloat162*>(act + int64_t(row) * n + col) =
          __floats2bfloat162_rn(detail::swiglu_value(gf.x, uf.x), detail::swiglu_value(gf.y, uf.y));
    }
  }
}

// Byte offset of (row, col) of a staging tile: box col / 64, in the 128-byte swizzle the store map
// reads (16-byte chunk c of row r at chunk position c ^ (r mod 8)). A warp's 32 pairs of one column
// step land in 32 different banks.
__device__ __forceinline__ uint32_t staged_offset(int row, int col) {
  return (col / kBoxColumns) * 64 * 128 + row * 128 +
         ((((col % kBoxColumns) / 8) ^ (row % 8)) << 4) + (col % 8) * 2;
}

// The warpgroup's named barrier (ids 1 and 2; 0 is __syncthreads').
__device__ __forceinline__ void warpgroup_sync(int consumer) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + consumer) : "memory");
}

// Rounds the accumulators (plus the residual the staging tile holds, when `add_staged`) into the
// staging tile, then `leader` stores its four boxes at (row0, col0) of C with TMA. The caller made
// sure the tile's previous store has read it (and, with a residual, that the residual arrived).
__device__ __forceinline__ void stage_and_store(const float (&d)[128], uint8_t* staging,
                                                uint32_t staging_address, bool add_staged,
                                                const CUtensorMap* map_c, int consumer, bool leader,
                                                int row0, int col0) {
#if defined(DSPINE_WGMMA)
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      auto* at = reinterpret_cast<__nv_bfloat162*>(
          staging + staged_offset(warp * 16 + lane / 4 + 8 * h, 8 * j + (lane % 4) * 2));
      float x = d[4 * j + 2 * h], y = d[4 * j + 2 * h + 1];
      if (add_staged) {
        const float2 r = __bfloat1622float2(*at);
        x += r.x;
        y += r.y;
      }
      *at = __floats2bfloat162_rn(x, y);
    }
  }
  wgmma::fence_shared();  // the generic stores, visible to the TMA engine's reads
  warpgroup_sync(consumer);
  if (leader) {
    for (int b = 0; b < kTileN / kBoxColumns; ++b) {
      tma::store_box(map_c, staging_address + b * 64 * 128, col0 + b * kBoxColumns, row0, 0, 0);
    }
    tma::commit_stores();
  }
#endif
}

// kSwiGLU: B holds a gate/up weight [2n, k] (gate rows, then up rows); a tile's B is 128 gate rows
// and the same 128 up rows, its C columns are those of the gate and of the up projection, and the
// epilogue is store_swiglu_tile's (c is gate_up [m, 2n], act [m, n]). Else stage_and_store's,
// through map_c (and the residual through map_residual when has_residual).
template <bool kSwiGLU>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_bf16_kernel(const __grid_constant__ CUtensorMap map_a,
                     const __grid_constant__ CUtensorMap map_b,
                     const __grid_constant__ CUtensorMap map_c,
                     const __grid_constant__ CUtensorMap map_residual, __nv_bfloat16* c,
                     bool has_residual, __nv_bfloat16* act, int m, int n, int k) {
  constexpr int kColumns = kSwiGLU ? kTileN / 2 : kTileN;  // output columns per tile
  constexpr int kStages = SharedLayout<kSwiGLU>::kStages;
#if defined(DSPINE_WGMMA)
  extern __shared__ uint8_t shared_raw[];
  __shared__ __align__(8) uint64_t full[kStages], empty[kStages], residual_ready[2];
  const uint32_t ring = (shared_address(shared_raw) + wgmma::kTileAlignment - 1) &
                        ~uint32_t(wgmma::kTileAlignment - 1);
  const int tiles_m = (m + kTileM - 1) / kTileM, tiles_n = (n + kColumns - 1) / kColumns;
  const int tiles = tiles_m * tiles_n, k_tiles = (k + kTileK - 1) / kTileK;
  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      tma::init_barrier(shared_address(&full[s]), 1);   // the producer's byte count
      tma::init_barrier(shared_address(&empty[s]), 2);  // one arrival per consumer warpgroup
    }
    for (int w = 0; w < 2; ++w) tma::init_barrier(shared_address(&residual_ready[w]), 1);
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
        if constexpr (kSwiGLU) {
          tma::copy_box(a + kBytesA, &map_b, f, kt * kTileK, tn * kColumns, 0, 0);
          tma::copy_box(a + kBytesA + kBytesB / 2, &map_b, f, kt * kTileK, n + tn * kColumns, 0, 0);
        } else {
          tma::copy_box(a + kBytesA, &map_b, f, kt * kTileK, tn * kTileN, 0, 0);
        }
        if (++stage == kStages) stage = 0, ++round;
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int consumer = warpgroup - 1;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const bool releases = warp == 0 && lane == 0;  // the warpgroup's one arrival on `empty`
  const uint32_t staging_address = ring + kStages * kStageBytes + consumer * kStagingBytes;
  uint8_t* const staging = shared_raw + (staging_address - shared_address(shared_raw));
  int stage = 0, round = 0, tile_count = 0;
  float d[128];
  for (int t = blockIdx.x; t < tiles; t += gridDim.x, ++tile_count) {
    int tm, tn;
    tile_position(t, tiles_m, tiles_n, tm, tn);
    const int out_row = tm * kTileM + consumer * 64, out_col = tn * kColumns;
    if constexpr (!kSwiGLU) {
      // The staging tile is free once the last tile's store has read it; with a residual, its
      // boxes are loaded into it now and arrive during the products.
      if (releases) {
        tma::wait_stores_read<0>();
        if (has_residual) {
          const uint32_t ready = shared_address(&residual_ready[consumer]);
          tma::expect_bytes(ready, kStagingBytes);
          for (int b = 0; b < kTileN / kBoxColumns; ++b) {
            tma::copy_box(staging_address + b * 64 * 128, &map_residual, ready,
                          out_col + b * kBoxColumns, out_row, 0, 0);
          }
        }
      }
    }
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
    if constexpr (kSwiGLU) {
      store_swiglu_tile(d, c, act, out_row + warp * 16 + lane / 4, out_col + (lane % 4) * 2, m, n);
    } else {
      if (has_residual) {
        tma::wait_barrier(shared_address(&residual_ready[consumer]), tile_count & 1);
      } else {
        warpgroup_sync(consumer);  // the leader has seen the last store read the staging tile
      }
      stage_and_store(d, staging, staging_address, has_residual, &map_c, consumer, releases,
                      out_row, out_col);
    }
  }
  if (releases) tma::wait_stores<0>();  // the staging tile outlives its last store
#endif
}

// A row-major [rows, cols] bf16 matrix, copied in [box_rows, 64] boxes in the 128-byte swizzle.
cudaError_t matrix_map(CUtensorMap* map, const void* base, int64_t rows, int64_t cols,
                       uint32_t box_rows) {
  const uint64_t row_bytes = uint64_t(cols) * 2;
  const uint64_t dims[4] = {uint64_t(cols), uint64_t(rows), 1, 1};
  const uint64_t strides[3] = {row_bytes, row_bytes * rows, row_bytes * rows};
  const uint32_t box[4] = {kTileK, box_rows, 1, 1};
  return tma::encode_bf16_map(map, base, dims, strides, box);
}

bool aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// A and B as the producer's TMA copies take them, the sizes the kernel's int indices hold, sm_90.
bool operands_supported(const void* a, const void* b, int64_t m, int64_t n, int64_t k) {
  const int64_t limit = int64_t(1) << 31;
  return m >= 1 && n >= 1 && k >= 1 && m < limit && n < limit && k < limit && k % 8 == 0 &&
         aligned(a, 16) && aligned(b, 16) && wgmma_available();
}

}  // namespace

bool gemm_bf16_supported(const void* a, const void* b, const void* c, const void* residual,
                         int64_t m, int64_t n, int64_t k) {
  return operands_supported(a, b, m, n, k) && n % 8 == 0 && aligned(c, 16) &&
         (residual == nullptr || aligned(residual, 16));
}

bool gemm_bf16_swiglu_supported(const void* a, const void* w, const void* gate_up, const void* act,
                                int64_t m, int64_t intermediate, int64_t k) {
  return act != nullptr && intermediate < (int64_t(1) << 30) && intermediate % 2 == 0 &&
         operands_supported(a, w, m, 2 * intermediate, k) && aligned(gate_up, 4) &&
         aligned(act, 4);
}

namespace {

template <bool kSwiGLU>
cudaError_t launch(const void* a, const void* b, void* c, const void* residual, void* act,
                   int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  constexpr int64_t columns = kSwiGLU ? kTileN / 2 : kTileN;
  constexpr int shared_bytes = SharedLayout<kSwiGLU>::kBytes;
  // map_c and map_residual go unused by the SwiGLU form, which stores directly; they then stay
  // zero (and so does the residual's without a residual).
  CUtensorMap map_a, map_b, map_c = {}, map_residual = {};
  if (cudaError_t e = matrix_map(&map_a, a, m, k, kTileM); e != cudaSuccess) return e;
  if (cudaError_t e = matrix_map(&map_b, b, kSwiGLU ? 2 * n : n, k, columns); e != cudaSuccess) {
    return e;
  }
  if constexpr (!kSwiGLU) {
    if (cudaError_t e = matrix_map(&map_c, c, m, n, 64); e != cudaSuccess) return e;
    if (residual != nullptr) {
      if (cudaError_t e = matrix_map(&map_residual, residual, m, n, 64); e != cudaSuccess) {
        return e;
      }
    }
  }
  static const cudaError_t configured = cudaFuncSetAttribute(
      gemm_bf16_kernel<kSwiGLU>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes);
  if (configured != cudaSuccess) return configured;
  const int64_t tiles = ((m + kTileM - 1) / kTileM) * ((n + columns - 1) / columns);
  const int grid = static_cast<int>(std::min<int64_t>(detail::multiprocessor_count(), tiles));
  gemm_bf16_kernel<kSwiGLU><<<grid, kThreads, shared_bytes, stream>>>(
      map_a, map_b, map_c, map_residual, static_cast<__nv_bfloat16*>(c), residual != nullptr,
      static_cast<__nv_bfloat16*>(act), static_cast<int>(m), static_cast<int>(n),
      static_cast<int>(k));
  return cudaGetLastError();
}

}  // namespace

cudaError_t gemm_bf16(const void* a, const void* b, void* c, const void* residual, int64_t m,
                      int64_t n, int64_t k, cudaStream_t stream) {
  if (!gemm_bf16_supported(a, b, c, residual, m, n, k)) return cudaErrorNotSupported;
  return launch<false>(a, b, c, residual, nullptr, m, n, k, stream);
}

cudaError_t gemm_bf16_swiglu(const void* a, const void* w, void* gate_up, void* act, int64_t m,
                             int64_t intermediate, int64_t k, cudaStream_t stream) {
  if (!gemm_bf16_swiglu_supported(a, w, gate_up, act, m, intermediate, k)) {
    return cudaErrorNotSupported;
  }
  return launch<true>(a, w, gate_up, nullptr, act, m, intermediate, k, stream);
}

}  // namespace dspine::kernels
