// DSpine block attention kernels (block_attention.h; the algorithm is in docs/kernels.md,
// "Block attention"). Flash-attention style: scores of a 64-row query tile against 64-key tiles
// with bf16 MMA (warp-level m16n8k16, or Hopper's wgmma; fp32 accumulators), an online softmax,
// and multi-buffered tile copies (cp.async, or TMA with wgmma). The reference is dense masked SDPA
// (src/model/attention.cpp); tests/gpu/test_block_attention_gpu.cpp compares the two.
#include "kernels/block_attention.h"

#include <cuda_bf16.h>

#include <cmath>

#include "kernels/async_copy.cuh"
#include "kernels/tma.cuh"
#include "kernels/wgmma.cuh"
#include "kernels/wgmma_probe.h"

namespace dspine::kernels {
namespace {

using bf16 = __nv_bfloat16;
using detail::commit_async;
using detail::copy16_async;
using detail::copy4_async;
using detail::shared_address;
using detail::wait_async;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 64;  // query rows of a tile: a block's positions × the group's query heads
constexpr int kKeys = 64;  // keys of a tile
constexpr float kLog2e = 1.4426950408889634f;

// Tiles in shared memory are row-major with rows padded by 16 bytes, so the 8 row addresses of an
// ldmatrix fall in distinct bank groups.
template <int D>
struct Smem {
  static constexpr int kStride = D + 8;
  static constexpr int kTile = kKeys * kStride;  // elements of one 64-row tile
};

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}

// c += a · b for a 16×16 A fragment and a 16×8 B fragment (b0, b1).
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x by the hardware approximation (2 ulp; 2^-inf = 0), as flash attention uses.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// The A fragment of keys 16kk..16kk+15 from the C fragments of two adjacent 8-wide tiles.
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&lo)[4],
                                       const float (&hi)[4]) {
  a[0] = pack_bf16(lo[0], lo[1]);
  a[1] = pack_bf16(lo[2], lo[3]);
  a[2] = pack_bf16(hi[0], hi[1]);
  a[3] = pack_bf16(hi[2], hi[3]);
}

// Where a 16-byte chunk (row r, chunk c) of a 64-row tile goes in shared memory. PaddedTile:
// row-major with padded rows (ldmatrix and mma.sync); SwizzledTile: the 128-byte swizzle layout of
// wgmma descriptors (kernels/wgmma.cuh).
template <int D>
struct PaddedTile {
  static constexpr int kElements = Smem<D>::kTile;
  __device__ static int at(int r, int c) { return r * Smem<D>::kStride + c * 8; }
};
template <int D>
struct SwizzledTile {
  static constexpr int kElements = kKeys * D;
  __device__ static int at(int r, int c) { return wgmma::swizzled_offset<kKeys>(r, c) / 2; }
};

// A fragments (16 rows × D) of a 64-row tile, rows `row0`..row0+15.
template <int D, typename Tile>
__device__ __forceinline__ void load_a(uint32_t (&a)[D / 16][4], const bf16* tile, int row0,
                                       int lane) {
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    ldmatrix_x4(a[ks], tile + Tile::at(row0 + lane % 16, 2 * ks + lane / 16));
  }
}

// c[nt] += A · Bᵀ over D where B is a row-major tile of 64 rows (its rows are the n dimension):
// scores q·kᵀ, dO·vᵀ (or kᵀ... with the roles swapped in the dk/dv pass).
template <int D>
__device__ __forceinline__ void gemm_rows(float (&c)[8][4], const uint32_t (&a)[D / 16][4],
                                          const bf16* b_tile, int lane) {
  constexpr int kStride = Smem<D>::kStride;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, b_tile + (np * 16 + (lane / 16) * 8 + lane % 8) * kStride + ks * 16 +
                         ((lane / 8) % 2) * 8);
      mma(c[2 * np], a[ks], b[0], b[1]);
      mma(c[2 * np + 1], a[ks], b[2], b[3]);
    }
  }
}

// The A fragments of a 16 × 64 P from its C fragments (keys 16kk..16kk + 15 in p_frag[kk]).
__device__ __forceinline__ void to_a_fragments(uint32_t (&p_frag)[4][4], const float (&p)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) c_to_a(p_frag[kk], p[2 * kk], p[2 * kk + 1]);
}

// acc[dt] += P · B where P (16 × 64) comes as A fragments and B is a row-major 64 × D tile whose
// rows are the k dimension: P·V, Pᵀ·dO, dS·K, dSᵀ·Q.
template <int D>
__device__ __forceinline__ void gemm_cols(float (&acc)[D / 8][4], const uint32_t (&p)[4][4],
                                          const bf16* b_tile, int lane) {
  constexpr int kStride = Smem<D>::kStride;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, b_tile + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * kStride +
                               dp * 16 + (lane / 16) * 8);
      mma(acc[2 * dp], p[kk], b[0], b[1]);
      mma(acc[2 * dp + 1], p[kk], b[2], b[3]);
    }
  }
}

// The two instruction sets the kernels are written against; each kernel is instantiated with one.
// Both compute a warpgroup's 64 rows (warp w: rows 16w..16w + 15) with A from registers in C/A
// fragment layout and B a 64-row tile in shared memory (in Ops::Tile's layout):
//   scores_async(c, a, tile)            c = A · tileᵀ over D, 64 × 64 (S, dP, Sᵀ, dPᵀ)
//   scores_async(c, a_tile, tile)       the same with A the 64-row tile a_tile (Sᵀ, dPᵀ)
//   accumulate_async(acc, p, tile)      acc += P · tile, 64 × D (P·V, dS·K, Pᵀ·dO, dSᵀ·Q)
//   wait<Pending>(regs...)              until at most `Pending` of the products started last are
//                                       in flight; `regs` (results of the finished ones) may be
//                                       used after it
//   written(regs)                       after ordinary instructions wrote `regs` (an
//                                       accumulator), before the next product reads them
//   tiles_ready()                       after this thread's tile copies completed, before the
//                                       barrier
//   tiles(smem)                         where the tiles start in dynamic shared memory
//                                       (kSmemSlack bytes beyond them are allocated for alignment)
// mma.sync computes each product when it is started; wgmma runs it asynchronously, so the
// forward overlaps a tile's softmax with the previous tile's P·V.
template <int D>
struct MmaSyncOps {
  using Tile = PaddedTile<D>;
  static constexpr int kForwardBlocksPerSm = 3;
  static constexpr bool kTensorCopies = false;  // key/value tiles copied by every thread (cp.async)
  static constexpr int kSmemSlack = 0;
  __device__ static bf16* tiles(unsigned char* smem) { return reinterpret_cast<bf16*>(smem); }
  __device__ static void tiles_ready() {}
  __device__ static void scores_async(float (&c)[8][4], const uint32_t (&a)[D / 16][4],
                                      const bf16* tile, int lane) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.f;
    gemm_rows<D>(c, a, tile, lane);
  }
  __device__ static void scores_async(float (&c)[8][4], const bf16* a_tile, const bf16* tile,
                                      int lane) {
    uint32_t a[D / 16][4];
    load_a<D, Tile>(a, a_tile, threadIdx.x / 32 * 16, lane);
    scores_async(c, a, tile, lane);
  }
  __device__ static void accumulate_async(float (&acc)[D / 8][4], const uint32_t (&p)[4][4],
                                          const bf16* tile, int lane) {
    gemm_cols<D>(acc, p, tile, lane);
  }
  template <int Pending, typename... Regs>
  __device__ static void wait(Regs&...) {}
  template <typename Regs>
  __device__ static void written(Regs&) {}
};

// Hopper's warpgroup MMA (kernels/wgmma.cuh; D = 128): the CTA's 4 warps are one warpgroup.
// Without sm_90a device code the bodies are empty (never launched: wgmma_available() is false).
template <int D>
struct WgmmaOps {
  static_assert(D == 128 && kThreads == 128);
  using Tile = SwizzledTile<D>;
  // Two CTAs per SM leave the forward the registers to keep its products asynchronous (at three,
  // ptxas serializes them); measured 2% faster than three.
  static constexpr int kForwardBlocksPerSm = 2;
  // The forward's and dq's key/value tiles by TMA (kernels/tma.cuh), one thread issuing them:
  // measured 1.08 -> 0.98 ms for the forward and 0.09 ms off the backward, against cp.async by
  // every thread.
  static constexpr bool kTensorCopies = true;
  static constexpr int kSmemSlack = wgmma::kTileAlignment;
  __device__ static bf16* tiles(unsigned char* smem) {
    const uint32_t address = shared_address(smem);
    const uint32_t aligned = (address + kSmemSlack - 1) & ~uint32_t(kSmemSlack - 1);
    return reinterpret_cast<bf16*>(smem + (aligned - address));
  }
  __device__ static void tiles_ready() {
#ifdef DSPINE_WGMMA
    wgmma::fence_shared();
#endif
  }
  __device__ static void scores_async(float (&c)[8][4], const uint32_t (&a)[D / 16][4],
                                      const bf16* tile, int) {
#ifdef DSPINE_WGMMA
    float(&flat)[32] = *reinterpret_cast<float(*)[32]>(&c[0][0]);
    const uint32_t base = shared_address(tile);
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      wgmma::mma_m64n64k16(flat, a[ks], wgmma::k_major<kKeys>(base, ks), ks > 0);
    }
    wgmma::commit();
#endif
  }
  __device__ static void scores_async(float (&c)[8][4], const bf16* a_tile, const bf16* tile,
                                      int) {
#ifdef DSPINE_WGMMA
    float(&flat)[32] = *reinterpret_cast<float(*)[32]>(&c[0][0]);
    const uint32_t a_base = shared_address(a_tile), base = shared_address(tile);
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      wgmma::mma_m64n64k16(flat, wgmma::k_major<kKeys>(a_base, ks), wgmma::k_major<kKeys>(base, ks),
                           ks > 0);
    }
    wgmma::commit();
#endif
  }
  __device__ static void accumulate_async(float (&acc)[D / 8][4], const uint32_t (&p)[4][4],
                                          const bf16* tile, int) {
#ifdef DSPINE_WGMMA
    float(&flat)[D / 2] = *reinterpret_cast<float(*)[D / 2]>(&acc[0][0]);
    const uint32_t base = shared_address(tile);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      wgmma::mma_m64n128k16(flat, p[kk], wgmma::mn_major<kKeys>(base, kk), 1);
    }
    wgmma::commit();
#endif
  }
  template <int Pending, typename... Regs>
  __device__ static void wait(Regs&... regs) {
#ifdef DSPINE_WGMMA
    wgmma::wait<Pending>();
    (wgmma::pin(regs), ...);
#endif
  }
  template <typename Regs>
  __device__ static void written(Regs& regs) {
#ifdef DSPINE_WGMMA
    wgmma::pin(regs);
#endif
  }
};

struct Problem {
  BlockAttentionShape shape;
  const int64_t* anchors;
  const uint8_t* keep;
  float scale;
  int group;             // query heads per kv head
  int64_t queries;       // N·bs
  int64_t keys;          // S + N·bs
  int context_tiles;     // ceil(S / 64)
};

Problem make_problem(const BlockAttentionShape& s, const int64_t* anchors, const uint8_t* keep,
                     float scale) {
  Problem p;
  p.shape = s;
  p.anchors = anchors;
  p.keep = keep;
  p.scale = scale;
  p.group = static_cast<int>(s.heads / s.kv_heads);
  p.queries = s.blocks * s.block_size;
  p.keys = s.context + p.queries;
  p.context_tiles = static_cast<int>((s.context + kKeys - 1) / kKeys);
  return p;
}

// Query row r (0..63) of block n for kv head g: head g·group + r / bs, position n·bs + r % bs.
struct QueryRow {
  bool valid;
  int head;
  int position;  // inside the block
};
__device__ __forceinline__ QueryRow query_row(const Problem& p, int g, int r) {
  const int bs = static_cast<int>(p.shape.block_size);
  const int local_head = r / bs;
  return {local_head < p.group, g * p.group + local_head, r % bs};
}

// Offset (elements) of query row r of block n, row b, kv head g in a [B, N·bs, H, D] tensor.
__device__ __forceinline__ int64_t query_offset(const Problem& p, int b, int n, int g, int r) {
  const QueryRow q = query_row(p, g, r);
  const int64_t position = static_cast<int64_t>(n) * p.shape.block_size + q.position;
  return ((b * p.queries + position) * p.shape.heads + q.head) * p.shape.head_dim;
}
__device__ __forceinline__ int64_t query_stat_offset(const Problem& p, int b, int n, int g, int r) {
  const QueryRow q = query_row(p, g, r);
  const int64_t position = static_cast<int64_t>(n) * p.shape.block_size + q.position;
  return (b * p.queries + position) * p.shape.heads + q.head;
}

// Key tile t of block n: t < context_tiles(n) is context keys 64t.., the tile after them is the
// block's own bs keys. Position (in k/v) of key c of the tile, or -1 when it holds no key.
__device__ __forceinline__ int64_t key_position(const Problem& p, bool block_tile, int64_t start,
                                                int c) {
  if (block_tile) return c < p.shape.block_size ? p.shape.context + start + c : -1;
  return start + c < p.shape.context ? start + c : -1;
}

// Async copies of 64 rows of D bf16 into a tile: thread i copies 16-byte chunk i mod (D / 8) of
// rows i / (D / 8) + s · kRowStep, so eight consecutive threads read 128 contiguous bytes of a row
// and a thread's chunks are a fixed stride apart (its addresses are a few adds each).
template <int D>
struct TileCopies {
  static constexpr int kChunks = D / 8;
  static constexpr int kRowStep = kThreads / kChunks;
  static constexpr int kPerThread = kKeys / kRowStep;
};

// Where the 64 query rows of a kv head's tile lie in a [B, N·bs, H, D] tensor, relative to the
// first position of the block (elements; -1 for rows past the group), written once per CTA so that
// a block's copies need no divisions. The table is ordered by copying thread: the kPerThread rows
// r0 + s · kRowStep of the threads with first row r0 are consecutive entries, which each such
// thread reads as 16-byte vectors (QueryRowOffsets).
template <int D>
struct QueryRowTable {
  using Copies = TileCopies<D>;
  static_assert(Copies::kPerThread % 4 == 0);
  __device__ static int slot(int r) {
    return (r % Copies::kRowStep) * Copies::kPerThread + r / Copies::kRowStep;
  }
  __device__ static void fill(int* table, const Problem& p, int g) {
    if (threadIdx.x < kRows) {
      const QueryRow q = query_row(p, g, threadIdx.x);
      table[slot(threadIdx.x)] =
          q.valid ? static_cast<int>((q.position * p.shape.heads + q.head) * p.shape.head_dim) : -1;
    }
  }
};

// This thread's entries of the query row table (its copies of a query tile's rows).
template <int D>
struct QueryRowOffsets {
  using Copies = TileCopies<D>;
  int at[Copies::kPerThread];
  __device__ explicit QueryRowOffsets(const int* table) {
    const int4* mine = reinterpret_cast<const int4*>(table + threadIdx.x / Copies::kChunks *
                                                                 Copies::kPerThread);
#pragma unroll
    for (int v = 0; v < Copies::kPerThread / 4; ++v) {
      const int4 four = mine[v];
      at[4 * v] = four.x;
      at[4 * v + 1] = four.y;
      at[4 * v + 2] = four.z;
      at[4 * v + 3] = four.w;
    }
  }
};

// Query rows of block n (rows past the group are zero-filled).
template <int D, typename Tile>
__device__ __forceinline__ void load_query_tile(bf16* dst, const bf16* src,
                                                const QueryRowOffsets<D>& rows, const Problem& p,
                                                int b, int n) {
  using Copies = TileCopies<D>;
  const int c = threadIdx.x % Copies::kChunks, r0 = threadIdx.x / Copies::kChunks;
  const bf16* base =
      src + (b * p.queries + static_cast<int64_t>(n) * p.shape.block_size) * p.shape.heads * D +
      c * 8;
#pragma unroll
  for (int s = 0; s < Copies::kPerThread; ++s) {
    const int offset = rows.at[s];
    copy16_async(dst + Tile::at(r0 + s * Copies::kRowStep, c), base + max(offset, 0),
                 offset >= 0);
  }
}
// Key rows of the context from `start`, or block `start / bs`'s own keys (rows past the keys that
// exist are zero-filled). A thread's rows are kRowStep apart: its source advances by a fixed
// stride and its destination by kRowStep swizzle rows.
template <int D, typename Tile>
__device__ __forceinline__ void load_key_tile(bf16* dst, const bf16* src, const Problem& p, int b,
                                              int g, bool block_tile, int64_t start) {
  using Copies = TileCopies<D>;
  const int c = threadIdx.x % Copies::kChunks, r0 = threadIdx.x / Copies::kChunks;
  const int64_t first = block_tile ? p.shape.context + start : start;
  const int64_t available = block_tile ? p.shape.block_size : p.shape.context - start;
  const int rows = available < kKeys ? static_cast<int>(available) : kKeys;
  const int64_t step = Copies::kRowStep * p.shape.kv_heads * D;
  const bf16* row = src + ((b * p.keys + first + r0) * p.shape.kv_heads + g) * D + c * 8;
#pragma unroll
  for (int s = 0; s < Copies::kPerThread; ++s) {
    const int r = r0 + s * Copies::kRowStep;
    // Rows past the keys are not read (zero-fill), so their address may lie past the tensor.
    copy16_async(dst + Tile::at(r, c), row + s * step, r < rows);
  }
}

// Zeroes this CTA's query rows of a [B, N·bs, H, D] tensor (a dropped block's output or dq).
template <int D>
__device__ __forceinline__ void zero_query_rows(bf16* dst, const Problem& p, int b, int n, int g) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    if (!query_row(p, g, r).valid) continue;
    *reinterpret_cast<uint4*>(dst + query_offset(p, b, n, g, r) + c * 8) = make_uint4(0, 0, 0, 0);
  }
}

// Starts the copy of a key tile and its value tile into buffer `buf` (one commit group).
template <int D, typename Tile>
__device__ __forceinline__ void prefetch_key_value_tiles(bf16* s_k, bf16* s_v, const bf16* k,
                                                         const bf16* v, const Problem& p, int b,
                                                         int g, int buf, bool block_tile,
                                                         int64_t start) {
  load_key_tile<D, Tile>(s_k + buf * Tile::kElements, k, p, b, g, block_tile, start);
  load_key_tile<D, Tile>(s_v + buf * Tile::kElements, v, p, b, g, block_tile, start);
  commit_async();
}

// Keys or values of a tile (as load_key_tile's) by TMA, with the WgmmaOps tile layout: two boxes of
// 64 keys × 64 columns, the swizzle layout's halves, counted on `barrier`. Unlike load_key_tile the
// rows past the tile's keys are not zeroed: they hold other keys (or zeros past the tensor), which
// the masks never let in.
__device__ __forceinline__ void copy_key_tile_tma(bf16* dst, const CUtensorMap& map,
                                                  uint32_t barrier, const Problem& p, int b, int g,
                                                  bool block_tile, int64_t start) {
#ifdef DSPINE_WGMMA
  const int row = static_cast<int>(block_tile ? p.shape.context + start : start);
  for (int half = 0; half < 2; ++half) {
    tma::copy_box(shared_address(dst) + half * kKeys * 128, &map, barrier, 64 * half, g, row, b);
  }
#endif
}
constexpr uint32_t kTmaTileBytes = kKeys * 128 * sizeof(bf16);  // one key tile at D 128

// Block n's query rows of kv head g (a query, dO or output tile) by TMA, in the rows and layout
// load_query_tile gives them (row = local head · bs + position): the map walks positions inside
// heads (query_tile_map), so each half of the swizzled tile is one box of bs positions × group heads.
// Rows past the group are not written.
__device__ __forceinline__ void copy_query_tile_tma(bf16* dst, const CUtensorMap& map,
                                                    uint32_t barrier, const Problem& p, int b,
                                                    int n, int g) {
#ifdef DSPINE_WGMMA
  const int position = static_cast<int>(n * p.shape.block_size);
  for (int half = 0; half < 2; ++half) {
    tma::copy_box(shared_address(dst) + half * kKeys * 128, &map, barrier, 64 * half, position,
                  g * p.group, b);
  }
#endif
}
__device__ __forceinline__ uint32_t query_tile_bytes(const Problem& p) {
  return static_cast<uint32_t>(p.group * p.shape.block_size) * 128 * sizeof(bf16);
}

// Zeroes `elements` bf16 (a multiple of 8) of shared memory with every thread of the CTA.
__device__ __forceinline__ void zero_tiles(bf16* dst, int elements) {
  for (int i = threadIdx.x * 8; i < elements; i += kThreads * 8) {
    *reinterpret_cast<uint4*>(dst + i) = make_uint4(0, 0, 0, 0);
  }
}

// Thread 0 prepares the two barriers on which TMA tile copies arrive (visible to every thread
// after the CTA's next barrier).
template <typename Ops>
__device__ __forceinline__ void init_tile_arrivals(uint64_t (&arrivals)[2]) {
#ifdef DSPINE_WGMMA
  if (Ops::kTensorCopies && threadIdx.x == 0) {
    tma::init_barrier(shared_address(&arrivals[0]));
    tma::init_barrier(shared_address(&arrivals[1]));
    tma::fence_barrier_init();
  }
#endif
}

// Is key c of the tile visible to a query at block position j? Context tile: c + start < anchor;
// block tile: c <= j.
__device__ __forceinline__ bool visible(bool block_tile, int64_t start, int64_t anchor, int c,
                                        int j) {
  return block_tile ? c <= j : start + c < anchor;
}

// Does every query of a block see every key of the tile? Context tiles entirely before the anchor;
// the last context tile and the block tile are masked.
__device__ __forceinline__ bool whole_tile_visible(bool block_tile, int64_t start, int64_t anchor) {
  return !block_tile && start + kKeys <= anchor;
}

// ---------------------------------------------------------------------------------------------
// Forward: one CTA per (block, kv head, row).

// Scores (C fragments: rows a and b of the thread, keys nt · 8 + 2 · (lane mod 4) + (e mod 2)) of
// keys the row's query cannot see, set to -inf. Called only for the tiles that have such keys, so
// the whole-tile case carries no per-element test.
__device__ __forceinline__ void mask_scores(float (&s)[8][4], bool block_tile, int64_t start,
                                            int64_t anchor, int pos_a, int pos_b, int lane) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = nt * 8 + 2 * (lane % 4) + (e & 1);
      if (!visible(block_tile, start, anchor, c, e < 2 ? pos_a : pos_b)) s[nt][e] = -INFINITY;
    }
  }
}

// The online softmax of one thread's two query rows (a: lane / 4, b: lane / 4 + 8 of its warp's
// 16): running maximum and sum, in log2 units.
struct SoftmaxRows {
  float max_a = -INFINITY, max_b = -INFINITY, sum_a = 0.f, sum_b = 0.f;
};

// Scores of one key tile (C fragments s[nt][e], 8 chunks of 8 keys; masked ones -inf) →
// unnormalised probabilities against the updated running maxima, in place; returns the factors
// (alpha_a, alpha_b) by which the output accumulated so far is to be rescaled. The maxima are
// taken on the raw scores (scale > 0), so that scaling and subtracting are one FMA per score.
__device__ __forceinline__ float2 softmax_tile(float (&s)[8][4], SoftmaxRows& rows,
                                               float scale_log2) {
  float tile_max_a = -INFINITY, tile_max_b = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    tile_max_a = fmaxf(tile_max_a, fmaxf(s[nt][0], s[nt][1]));
    tile_max_b = fmaxf(tile_max_b, fmaxf(s[nt][2], s[nt][3]));
  }
#pragma unroll
  for (int offset = 1; offset < 4; offset <<= 1) {
    tile_max_a = fmaxf(tile_max_a, __shfl_xor_sync(0xffffffffu, tile_max_a, offset));
    tile_max_b = fmaxf(tile_max_b, __shfl_xor_sync(0xffffffffu, tile_max_b, offset));
  }
  const float new_a = fmaxf(rows.max_a, tile_max_a * scale_log2);
  const float new_b = fmaxf(rows.max_b, tile_max_b * scale_log2);
  // A row that has seen no key yet keeps a finite reference so no inf - inf appears.
  const float use_a = new_a == -INFINITY ? 0.f : new_a;
  const float use_b = new_b == -INFINITY ? 0.f : new_b;
  const float alpha_a = fast_exp2(rows.max_a - use_a), alpha_b = fast_exp2(rows.max_b - use_b);
  rows.max_a = new_a;
  rows.max_b = new_b;
  float row_sum_a = 0.f, row_sum_b = 0.f;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    s[nt][0] = fast_exp2(fmaf(s[nt][0], scale_log2, -use_a));
    s[nt][1] = fast_exp2(fmaf(s[nt][1], scale_log2, -use_a));
    s[nt][2] = fast_exp2(fmaf(s[nt][2], scale_log2, -use_b));
    s[nt][3] = fast_exp2(fmaf(s[nt][3], scale_log2, -use_b));
    row_sum_a += s[nt][0] + s[nt][1];
    row_sum_b += s[nt][2] + s[nt][3];
  }
  rows.sum_a = rows.sum_a * alpha_a + row_sum_a;
  rows.sum_b = rows.sum_b * alpha_b + row_sum_b;
  return make_float2(alpha_a, alpha_b);
}

// o[dt] (C fragments over D) *= alpha per row.
template <int D>
__device__ __forceinline__ void rescale_rows(float (&o)[D / 8][4], float2 alpha) {
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    o[dt][0] *= alpha.x;
    o[dt][1] *= alpha.x;
    o[dt][2] *= alpha.y;
    o[dt][3] *= alpha.y;
  }
}

// Stores the thread's two rows (row_a, row_b) of a 64 × D accumulator (C fragments) into a
// [B, N·bs, H, D] tensor, each row times its factor; rows past the group are not stored.
template <int D>
__device__ __forceinline__ void store_query_rows(bf16* dst, const Problem& p, int b, int n, int g,
                                                 int row_a, int row_b, const float (&acc)[D / 8][4],
                                                 float factor_a, float factor_b, int lane) {
  const bool valid_a = query_row(p, g, row_a).valid, valid_b = query_row(p, g, row_b).valid;
  bf16* dst_a = dst + (valid_a ? query_offset(p, b, n, g, row_a) : 0);
  bf16* dst_b = dst + (valid_b ? query_offset(p, b, n, g, row_b) : 0);
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    const int col = dt * 8 + 2 * (lane % 4);
    if (valid_a) {
      *reinterpret_cast<uint32_t*>(dst_a + col) =
          pack_bf16(acc[dt][0] * factor_a, acc[dt][1] * factor_a);
    }
    if (valid_b) {
      *reinterpret_cast<uint32_t*>(dst_b + col) =
          pack_bf16(acc[dt][2] * factor_b, acc[dt][3] * factor_b);
    }
  }
}

// Normalises and stores the thread's two output rows and their log2-sum-exp.
template <int D>
__device__ __forceinline__ void store_output_rows(const Problem& p, int b, int n, int g, int row_a,
                                                  int row_b, float (&o)[D / 8][4],
                                                  SoftmaxRows rows, int lane, bf16* out,
                                                  float* lse) {
#pragma unroll
  for (int offset = 1; offset < 4; offset <<= 1) {
    rows.sum_a += __shfl_xor_sync(0xffffffffu, rows.sum_a, offset);
    rows.sum_b += __shfl_xor_sync(0xffffffffu, rows.sum_b, offset);
  }
  store_query_rows<D>(out, p, b, n, g, row_a, row_b, o, 1.f / rows.sum_a, 1.f / rows.sum_b, lane);
  const bool valid_a = query_row(p, g, row_a).valid, valid_b = query_row(p, g, row_b).valid;
  if (lane % 4 == 0) {
    if (valid_a) lse[query_stat_offset(p, b, n, g, row_a)] = rows.max_a + log2f(rows.sum_a);
    if (valid_b) lse[query_stat_offset(p, b, n, g, row_b)] = rows.max_b + log2f(rows.sum_b);
  }
}

// A dropped block: zero output rows and lse = +inf (every key masked).
template <int D>
__device__ __forceinline__ void store_dropped_block(const Problem& p, int b, int n, int g, bf16* out,
                                                    float* lse) {
  zero_query_rows<D>(out, p, b, n, g);
  if (threadIdx.x < kRows && query_row(p, g, threadIdx.x).valid) {
    lse[query_stat_offset(p, b, n, g, threadIdx.x)] = INFINITY;
  }
}

template <int D, typename Ops>
__global__ void __launch_bounds__(kThreads, Ops::kForwardBlocksPerSm)
    attention_forward_kernel(Problem p, const bf16* __restrict__ q, const bf16* __restrict__ k,
                             const bf16* __restrict__ v, bf16* __restrict__ out,
                             float* __restrict__ lse, const __grid_constant__ CUtensorMap key_map,
                             const __grid_constant__ CUtensorMap value_map,
                             const __grid_constant__ CUtensorMap query_map) {
  using Tile = typename Ops::Tile;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  // The query tile is staged in the second key buffer and moved to registers before that buffer is
  // refilled, so four tiles of shared memory suffice (up to three CTAs per SM).
  bf16* s_k = Ops::tiles(smem_bytes);  // two buffers
  bf16* s_v = s_k + 2 * Tile::kElements;            // two buffers
  bf16* s_q = s_k + Tile::kElements;
  // Later blocks have longer prefixes (anchors usually ascend): start them first, across all
  // (kv head, row) pairs (the grid's slowest dimension is the block).
  const int n = static_cast<int>(p.shape.blocks - 1 - blockIdx.z);
  const int g = blockIdx.x, b = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t anchor = p.anchors[b * p.shape.blocks + n];
  const int row_a = warp * 16 + lane / 4, row_b = row_a + 8;
  if (p.keep[b * p.shape.blocks + n] == 0) {
    store_dropped_block<D>(p, b, n, g, out, lse);
    return;
  }

  const int context_tiles = static_cast<int>((anchor + kKeys - 1) / kKeys);
  const int tiles = context_tiles + 1;
  auto tile_start = [&](int t) -> int64_t {
    return t < context_tiles ? static_cast<int64_t>(t) * kKeys : n * p.shape.block_size;
  };
  // With tensor copies, group i of tiles (i = -1: the query tile and keys 0, before the loop;
  // i = t: keys t + 1 and values t, those that exist) is issued by thread 0 and arrives on
  // barrier i & 1, in that barrier's phase ((i + 1) >> 1) & 1. A group is never issued before
  // every thread has waited for the one two before it on the same barrier (the loop's barrier lies
  // between).
  __shared__ __align__(8) uint64_t arrivals[2];
  auto arrival = [&](int i) { return shared_address(&arrivals[i & 1]); };
  auto issue_group = [&](int i) {
#ifdef DSPINE_WGMMA
    const bool keys = i + 1 < tiles, values = i >= 0 && i < tiles;
    if (!keys && !values) return;
    const uint32_t barrier = arrival(i);
    const uint32_t staged = i < 0 ? query_tile_bytes(p) : 0;
    tma::expect_bytes(barrier, (int(keys) + int(values)) * kTmaTileBytes + staged);
    if (i < 0) copy_query_tile_tma(s_q, query_map, barrier, p, b, n, g);
    if (keys) {
      copy_key_tile_tma(s_k + ((i + 1) & 1) * Tile::kElements, key_map, barrier, p, b, g,
                        i + 1 == context_tiles, tile_start(i + 1));
    }
    if (values) {
      copy_key_tile_tma(s_v + (i & 1) * Tile::kElements, value_map, barrier, p, b, g,
                        i == context_tiles, tile_start(i));
    }
#endif
  };
  auto wait_group = [&](int i) {
#ifdef DSPINE_WGMMA
    tma::wait_barrier(arrival(i), ((i + 1) >> 1) & 1);
#endif
  };
  __shared__ __align__(16) int query_rows[kRows];
  QueryRowTable<D>::fill(query_rows, p, g);
  init_tile_arrivals<Ops>(arrivals);
  if constexpr (Ops::kTensorCopies) {
    // Rows past the group are never copied: zeroed, their scores are 0 and they are not stored.
    if (p.group * p.shape.block_size < kRows) zero_tiles(s_q, Tile::kElements);
    Ops::tiles_ready();
    __syncthreads();
    if (threadIdx.x == 0) issue_group(-1);
    wait_group(-1);
  } else {
    __syncthreads();
    load_query_tile<D, Tile>(s_q, q, QueryRowOffsets<D>(query_rows), p, b, n);
    load_key_tile<D, Tile>(s_k, k, p, b, g, context_tiles == 0, tile_start(0));
    commit_async();
    wait_async<0>();
    __syncthreads();
  }
  uint32_t q_frag[D / 16][4];
  load_a<D, Tile>(q_frag, s_q, warp * 16, lane);

  const float scale_log2 = p.scale * kLog2e;
  const int pos_a = query_row(p, g, row_a).position, pos_b = query_row(p, g, row_b).position;
  float o[D / 8][4] = {};
  uint32_t p_frag[4][4];  // probabilities of the previous tile, A fragments for its P·V
  SoftmaxRows rows;

  // Iteration t computes the scores of tile t and the P·V of tile t - 1, so the value tiles run
  // one behind the key tiles: iteration t prefetches keys t + 1 and values t. With wgmma, tile t's
  // softmax runs while the tensor cores do tile t - 1's P·V.
  for (int t = 0; t <= tiles; ++t) {
    if constexpr (Ops::kTensorCopies) {
      // The query tile's copies and reads (ordinary accesses) come before the copy engine's
      // writes of keys 1 over its staging buffer.
      if (t == 0) Ops::tiles_ready();
      __syncthreads();  // every warp is done with the buffers refilled below
      if (threadIdx.x == 0) issue_group(t);
      wait_group(t - 1);  // keys t and values t - 1
    } else {
      __syncthreads();  // every warp is done with the buffers refilled below
      if (t + 1 < tiles) load_key_tile<D, Tile>(s_k + ((t + 1) & 1) * Tile::kElements, k, p, b, g,
                                                t + 1 == context_tiles, tile_start(t + 1));
      if (t < tiles) load_key_tile<D, Tile>(s_v + (t & 1) * Tile::kElements, v, p, b, g,
                                            t == context_tiles, tile_start(t));
      commit_async();
      wait_async<1>();  // keys t and values t - 1
      Ops::tiles_ready();
      __syncthreads();
    }

    if (t == tiles) {
      Ops::accumulate_async(o, p_frag, s_v + ((t - 1) & 1) * Tile::kElements, lane);
      Ops::template wait<0>(o);
      break;
    }
    float s[8][4];
    Ops::scores_async(s, q_frag, s_k + (t & 1) * Tile::kElements, lane);
    if (t > 0) {
      Ops::accumulate_async(o, p_frag, s_v + ((t - 1) & 1) * Tile::kElements, lane);
      Ops::template wait<1>(s);
    } else {
      Ops::template wait<0>(s);
    }
    const bool block_tile = t == context_tiles;
    const int64_t start = tile_start(t);
    if (!whole_tile_visible(block_tile, start, anchor)) {
      mask_scores(s, block_tile, start, anchor, pos_a, pos_b, lane);
    }
    const float2 alpha = softmax_tile(s, rows, scale_log2);
    Ops::template wait<0>(o);
    rescale_rows<D>(o, alpha);
    Ops::written(o);
    to_a_fragments(p_frag, s);
  }
  store_output_rows<D>(p, b, n, g, row_a, row_b, o, rows, lane, out, lse);
}

// ---------------------------------------------------------------------------------------------
// Backward.

// delta = rowsum(dout ∘ out) of the thread's two rows (a, b) from their A fragments (a quad of
// lanes holds a row: registers 0 and 2 of each fragment are row a, 1 and 3 row b).
template <int D>
__device__ __forceinline__ float2 row_dots(const uint32_t (&x)[D / 16][4],
                                           const uint32_t (&y)[D / 16][4]) {
  float dot_a = 0.f, dot_b = 0.f;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 xf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x[ks][i]));
      const float2 yf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&y[ks][i]));
      const float dot = xf.x * yf.x + xf.y * yf.y;
      if (i % 2 == 0) {
        dot_a += dot;
      } else {
        dot_b += dot;
      }
    }
  }
#pragma unroll
  for (int offset = 1; offset < 4; offset <<= 1) {
    dot_a += __shfl_xor_sync(0xffffffffu, dot_a, offset);
    dot_b += __shfl_xor_sync(0xffffffffu, dot_b, offset);
  }
  return make_float2(dot_a, dot_b);
}

// dq: one CTA per (block, kv head, row), over the block's visible key tiles as in the forward.
// It first computes its rows' delta = rowsum(dout ∘ out), which it needs itself and writes for the
// dk/dv pass (no separate pass over out and dout). Key/value tiles go through three buffers, so
// that a tile's dQ product can still be running while the next tile is copied and its scores
// start: the copy into a buffer waits only for the products of two tiles before.
template <int D, typename Ops>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(Problem p, const bf16* __restrict__ q, const bf16* __restrict__ k,
              const bf16* __restrict__ v, const bf16* __restrict__ out,
              const bf16* __restrict__ dout, const float* __restrict__ lse,
              float* __restrict__ delta, bf16* __restrict__ dq,
              const __grid_constant__ CUtensorMap key_map,
              const __grid_constant__ CUtensorMap value_map,
              const __grid_constant__ CUtensorMap query_map,
              const __grid_constant__ CUtensorMap dout_map,
              const __grid_constant__ CUtensorMap out_map) {
  using Tile = typename Ops::Tile;
  constexpr int kBuffers = 3;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  bf16* s_k = Ops::tiles(smem_bytes);            // three buffers
  bf16* s_v = s_k + kBuffers * Tile::kElements;  // three buffers
  // The query and dO tiles are staged in the third buffers and moved to registers at the first
  // tile, before those buffers are first refilled (with tile 2); the output tile (for delta) is
  // staged in the second key buffer, read before tile 1 is copied there.
  bf16* s_q = s_k + 2 * Tile::kElements;
  bf16* s_do = s_v + 2 * Tile::kElements;
  bf16* s_out = s_k + Tile::kElements;
  const int n = static_cast<int>(p.shape.blocks - 1 - blockIdx.z);
  const int g = blockIdx.x, b = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t anchor = p.anchors[b * p.shape.blocks + n];
  const bool keep = p.keep[b * p.shape.blocks + n] != 0;
  const int row_a = warp * 16 + lane / 4, row_b = row_a + 8;
  const bool valid_a = query_row(p, g, row_a).valid, valid_b = query_row(p, g, row_b).valid;

  if (!keep) {
    zero_query_rows<D>(dq, p, b, n, g);
    return;
  }

  const int context_tiles = static_cast<int>((anchor + kKeys - 1) / kKeys);
  const int tiles = context_tiles + 1;
  auto tile_start = [&](int t) -> int64_t {
    return t < context_tiles ? static_cast<int64_t>(t) * kKeys : n * p.shape.block_size;
  };
  // With tensor copies, tile i's keys and values are issued by thread 0 and arrive on barrier
  // i & 1, in that barrier's phase (i >> 1) & 1; tile i + 2 is issued only after every thread
  // has waited for tile i (the loop's barrier lies between). The query, dO and output tiles
  // arrive with tile 0.
  __shared__ __align__(8) uint64_t arrivals[2];
  auto arrival = [&](int i) { return shared_address(&arrivals[i & 1]); };
  auto copy_tiles = [&](int t) {
    if constexpr (Ops::kTensorCopies) {
#ifdef DSPINE_WGMMA
      if (threadIdx.x == 0) {
        const uint32_t barrier = arrival(t);
        const uint32_t staged = t == 0 ? 3 * query_tile_bytes(p) : 0;
        tma::expect_bytes(barrier, 2 * kTmaTileBytes + staged);
        if (t == 0) {
          copy_query_tile_tma(s_q, query_map, barrier, p, b, n, g);
          copy_query_tile_tma(s_do, dout_map, barrier, p, b, n, g);
          copy_query_tile_tma(s_out, out_map, barrier, p, b, n, g);
        }
        copy_key_tile_tma(s_k + t % kBuffers * Tile::kElements, key_map, barrier, p, b, g,
                          t == context_tiles, tile_start(t));
        copy_key_tile_tma(s_v + t % kBuffers * Tile::kElements, value_map, barrier, p, b, g,
                          t == context_tiles, tile_start(t));
      }
#endif
    } else {
      prefetch_key_value_tiles<D, Tile>(s_k, s_v, k, v, p, b, g, t % kBuffers,
                                        t == context_tiles, tile_start(t));
    }
  };
  __shared__ __align__(16) int query_rows[kRows];
  QueryRowTable<D>::fill(query_rows, p, g);
  init_tile_arrivals<Ops>(arrivals);
  if constexpr (Ops::kTensorCopies) {
    // Rows past the group are never copied: zeroed, they give delta 0 and are not stored. (The
    // staging tiles are key buffers 1 and 2, which are contiguous, and value buffer 2.)
    if (p.group * p.shape.block_size < kRows) {
      zero_tiles(s_out, 2 * Tile::kElements);
      zero_tiles(s_do, Tile::kElements);
    }
    Ops::tiles_ready();
    __syncthreads();
  } else {
    __syncthreads();
    const QueryRowOffsets<D> rows(query_rows);
    load_query_tile<D, Tile>(s_q, q, rows, p, b, n);
    load_query_tile<D, Tile>(s_do, dout, rows, p, b, n);
    load_query_tile<D, Tile>(s_out, out, rows, p, b, n);
    commit_async();
  }
  copy_tiles(0);

  const float scale_log2 = p.scale * kLog2e;
  const int pos_a = query_row(p, g, row_a).position, pos_b = query_row(p, g, row_b).position;
  const float lse_a = valid_a ? lse[query_stat_offset(p, b, n, g, row_a)] : INFINITY;
  const float lse_b = valid_b ? lse[query_stat_offset(p, b, n, g, row_b)] : INFINITY;
  float delta_a = 0.f, delta_b = 0.f;  // set at the first tile
  uint32_t q_frag[D / 16][4], do_frag[D / 16][4];
  uint32_t ds_frag[4][4];  // dS of the previous tile, A fragments of its running dQ product
  float acc[D / 8][4] = {};

  for (int t = 0; t < tiles; ++t) {
    const int buf = t % kBuffers;
    wait_async<0>();  // tile t, or with tensor copies at t = 0 the query, dO and output tiles
    if constexpr (Ops::kTensorCopies) {
#ifdef DSPINE_WGMMA
      tma::wait_barrier(arrival(t), (t >> 1) & 1);
#endif
    } else {
      Ops::tiles_ready();
    }
    // Every warp has its copies of tile t in and has finished the products of tile t - 2 (waited
    // for in the previous iteration), whose buffer the next copy refills.
    __syncthreads();
    if (t == 0) {
      load_a<D, Tile>(q_frag, s_q, warp * 16, lane);
      load_a<D, Tile>(do_frag, s_do, warp * 16, lane);
      uint32_t out_frag[D / 16][4];
      load_a<D, Tile>(out_frag, s_out, warp * 16, lane);
      const float2 dots = row_dots<D>(out_frag, do_frag);
      // Rows past the group are zero-filled: their delta is 0 and they are not stored.
      delta_a = dots.x;
      delta_b = dots.y;
      if (lane % 4 == 0) {
        if (valid_a) delta[query_stat_offset(p, b, n, g, row_a)] = delta_a;
        if (valid_b) delta[query_stat_offset(p, b, n, g, row_b)] = delta_b;
      }
      // Every warp has read the staged tiles (ordinary accesses) before tiles 1 and 2 are copied
      // over them.
      if constexpr (Ops::kTensorCopies) Ops::tiles_ready();
      __syncthreads();
    }
    if (t + 1 < tiles) copy_tiles(t + 1);
    float s[8][4], dp[8][4];
    Ops::scores_async(s, q_frag, s_k + buf * Tile::kElements, lane);
    Ops::scores_async(dp, do_frag, s_v + buf * Tile::kElements, lane);
    Ops::template wait<0>(s, dp, acc);  // the previous tile's dQ product finishes first
    const bool block_tile = t == context_tiles;
    const int64_t start = tile_start(t);
    if (!whole_tile_visible(block_tile, start, anchor)) {
      mask_scores(s, block_tile, start, anchor, pos_a, pos_b, lane);
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float prob = fast_exp2(s[nt][e] * scale_log2 - (e < 2 ? lse_a : lse_b));
        s[nt][e] = prob * (dp[nt][e] - (e < 2 ? delta_a : delta_b));  // dS
      }
    }
    to_a_fragments(ds_frag, s);
    Ops::accumulate_async(acc, ds_frag, s_k + buf * Tile::kElements, lane);
  }
  Ops::template wait<0>(acc);

  store_query_rows<D>(dq, p, b, n, g, row_a, row_b, acc, p.scale, p.scale, lane);
}

// The blocks that see a context key tile, collected into shared memory a window of kBlockWindow
// candidates at a time, so that the dk/dv loop over them waits on no global loads. An entry is
// n · 128 + the number of the tile's keys block n sees (1..64, all when it is 64).
constexpr int kBlockWindow = 512;
__device__ __forceinline__ int block_entry(int n, int visible_keys) { return n * 128 + visible_keys; }
__device__ __forceinline__ int entry_block(int entry) { return entry >> 7; }
__device__ __forceinline__ int entry_visible_keys(int entry) { return entry & 127; }

// Writes the entries of the kept blocks n in [from, from + kBlockWindow) anchored after `start`,
// in ascending order, into `list`; returns their count. Called by every thread of the CTA.
__device__ int collect_visible_blocks(int* list, int* warp_totals, const Problem& p, int b,
                                      int from, int64_t start) {
  constexpr int kPerThread = kBlockWindow / kThreads;
  const int64_t* anchors = p.anchors + b * p.shape.blocks;
  const uint8_t* keep = p.keep + b * p.shape.blocks;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int entry[kPerThread];
  int count = 0;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int n = from + threadIdx.x * kPerThread + i;
    entry[i] = -1;
    if (n < p.shape.blocks && keep[n] != 0 && anchors[n] > start) {
      const int64_t visible_keys = anchors[n] - start;
      entry[i] = block_entry(n, visible_keys < kKeys ? static_cast<int>(visible_keys) : kKeys);
      ++count;
    }
  }
  int inclusive = count;  // prefix sum over the warp
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int below = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += below;
  }
  __syncthreads();  // every thread is done with the previous window
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  int at = inclusive - count, total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) at += warp_totals[w];
    total += warp_totals[w];
  }
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    if (entry[i] >= 0) list[at++] = entry[i];
  }
  __syncthreads();
  return total;
}

// dk, dv: one CTA per (key tile, kv head, row). Tiles 0..context_tiles-1 are 64 context keys;
// tile context_tiles + n is block n's own keys. The CTA walks the blocks that see its keys; each
// warp accumulates 16 keys' gradients over all of them (every query head of the group included).
template <int D, typename Ops>
__global__ void __launch_bounds__(kThreads)
    attention_dkdv_kernel(Problem p, const bf16* __restrict__ q, const bf16* __restrict__ k,
                const bf16* __restrict__ v, const bf16* __restrict__ dout,
                const float* __restrict__ lse, const float* __restrict__ delta,
                bf16* __restrict__ dk, bf16* __restrict__ dv,
                const __grid_constant__ CUtensorMap query_map,
                const __grid_constant__ CUtensorMap dout_map) {
  static_assert(kThreads == 2 * kRows, "one thread copies each row's lse and one its delta");
  using Tile = typename Ops::Tile;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  bf16* s_k = Ops::tiles(smem_bytes);
  bf16* s_v = s_k + Tile::kElements;
  bf16* s_q = s_v + Tile::kElements;      // two buffers
  bf16* s_do = s_q + 2 * Tile::kElements;  // two buffers
  float* s_stats = reinterpret_cast<float*>(s_do + 2 * Tile::kElements);  // two buffers of 128:
                                                                         // 64 lse, 64 delta

  // Tiles go out in order, slowest grid dimension: context tile t is seen by the blocks anchored
  // after 64t, so the first tiles are the longest CTAs (hundreds of blocks at the recipe's size)
  // and start first for every (kv head, row) pair; the single-block tiles fill in at the end.
  const int tile = blockIdx.z, g = blockIdx.x, b = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool block_tile = tile >= p.context_tiles;
  const int own_block = tile - p.context_tiles;
  const int64_t start =
      block_tile ? own_block * p.shape.block_size : static_cast<int64_t>(tile) * kKeys;

  __shared__ __align__(16) int query_rows[kRows];
  __shared__ int visible_list[kBlockWindow];
  __shared__ int warp_totals[kWarps];
  QueryRowTable<D>::fill(query_rows, p, g);
  __syncthreads();

  // The entries of the blocks that see this tile, from the last block to the first (-1 after
  // them): a block tile is seen by its own block only. Every context tile's CTA starts at the last
  // blocks, so the CTAs running at the same time read the same blocks' query and dO rows at about
  // the same time, from L2; in ascending order each would start at its own first block, spread
  // over more rows than L2 holds.
  int window_from = (p.shape.blocks - 1) / kBlockWindow * kBlockWindow, remaining = 0;
  bool own_taken = false;
  auto next_entry = [&]() -> int {
    if (block_tile) {
      const bool first = !own_taken;
      own_taken = true;
      return first && p.keep[b * p.shape.blocks + own_block] != 0 ? block_entry(own_block, 0)
                                                                   : -1;
    }
    while (remaining == 0) {
      if (window_from < 0) return -1;
      remaining = collect_visible_blocks(visible_list, warp_totals, p, b, window_from, start);
      window_from -= kBlockWindow;
    }
    return visible_list[--remaining];
  };

  // This thread's lse (threads 0..63) or delta (64..127) row of a block: its offset in [B, N·bs, H]
  // from the block's first position (rows past the group read nothing and get 0; their q and dout
  // rows are zero, so they add nothing to dk and dv).
  const int stat_row = threadIdx.x % kRows;
  const int stat_offset = query_rows[QueryRowTable<D>::slot(stat_row)];
  const float* stat_source = threadIdx.x < kRows ? lse : delta;
  // With tensor copies, a block's query and dO tiles come by TMA from one thread
  // (copy_query_tile_tma), load i into buffer i & 1, arriving on barrier i & 1 in phase
  // (i >> 1) & 1; the lse/delta rows still come by cp.async from every thread.
  __shared__ __align__(8) uint64_t arrivals[2];
  auto arrival = [&](int i) { return shared_address(&arrivals[i & 1]); };
  auto load_block = [&](int n, int i) {
    const int buf = i & 1;
    if constexpr (Ops::kTensorCopies) {
#ifdef DSPINE_WGMMA
      if (threadIdx.x == 0) {
        const uint32_t bytes = query_tile_bytes(p);
        tma::expect_bytes(arrival(i), 2 * bytes);
        copy_query_tile_tma(s_q + buf * Tile::kElements, query_map, arrival(i), p, b, n, g);
        copy_query_tile_tma(s_do + buf * Tile::kElements, dout_map, arrival(i), p, b, n, g);
      }
#endif
    } else {
      const QueryRowOffsets<D> rows(query_rows);
      load_query_tile<D, Tile>(s_q + buf * Tile::kElements, q, rows, p, b, n);
      load_query_tile<D, Tile>(s_do + buf * Tile::kElements, dout, rows, p, b, n);
    }
    const int64_t first = (b * p.queries + static_cast<int64_t>(n) * p.shape.block_size) *
                          p.shape.heads;
    copy4_async(s_stats + buf * 2 * kRows + threadIdx.x,
                stat_source + first + max(stat_offset, 0) / D, stat_offset >= 0);
  };
  auto wait_block = [&](int i, bool loaded) {
    wait_async<0>();
#ifdef DSPINE_WGMMA
    if constexpr (Ops::kTensorCopies) {
      if (loaded) tma::wait_barrier(arrival(i), (i >> 1) & 1);
    }
#endif
    Ops::tiles_ready();
    __syncthreads();
  };

  if constexpr (Ops::kTensorCopies) {
    // Rows past the group are never copied: zeroed once, they add nothing to dk and dv.
    if (p.group * p.shape.block_size < kRows) zero_tiles(s_q, 4 * Tile::kElements);
    init_tile_arrivals<Ops>(arrivals);
    Ops::tiles_ready();
    __syncthreads();
  }
  load_key_tile<D, Tile>(s_k, k, p, b, g, block_tile, start);
  load_key_tile<D, Tile>(s_v, v, p, b, g, block_tile, start);
  int entry = next_entry(), loads = 0;
  if (entry >= 0) load_block(entry_block(entry), loads);
  commit_async();
  wait_block(loads, entry >= 0);

  // Each iteration finishes block n and starts the next block's scores before waiting for its own
  // dK product, so the tensor cores work through the elementwise part and the barrier.
  const float scale_log2 = p.scale * kLog2e;
  const int key_a = warp * 16 + lane / 4, key_b = key_a + 8;  // this thread's keys in the tile
  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
  float s[8][4], dp[8][4];  // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ: the warp's 16 keys × the block's 64 rows
  if (entry >= 0) {
    Ops::scores_async(s, s_k, s_q, lane);
    Ops::scores_async(dp, s_v, s_do, lane);
  }
  while (entry >= 0) {
    const int buf = loads & 1;
    const int following = next_entry();
    if (following >= 0) {
      load_block(entry_block(following), loads + 1);
      commit_async();
    }
    const bf16* tile_q = s_q + buf * Tile::kElements;
    const bf16* tile_do = s_do + buf * Tile::kElements;
    const float* block_lse = s_stats + buf * 2 * kRows;
    const float* block_delta = block_lse + kRows;
    const int visible_keys = entry_visible_keys(entry);

    Ops::template wait<0>(s, dp);
    // Masked keys: in a context tile, those at or after the anchor; in a block tile, those after
    // the query's position (keys past the block's bs are never visible).
    if (block_tile || visible_keys < kKeys) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = nt * 8 + 2 * (lane % 4) + (e & 1);  // query row
          const int key = e < 2 ? key_a : key_b;
          const bool see = block_tile ? key <= query_row(p, g, r).position : key < visible_keys;
          if (!see) s[nt][e] = -INFINITY;
        }
      }
    }
    uint32_t p_frag[4][4], ds_frag[4][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = nt * 8 + 2 * (lane % 4) + (e & 1);  // query row
        s[nt][e] = fast_exp2(s[nt][e] * scale_log2 - block_lse[r]);
      }
    }
    to_a_fragments(p_frag, s);
    Ops::accumulate_async(dv_acc, p_frag, tile_do, lane);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = nt * 8 + 2 * (lane % 4) + (e & 1);  // query row
        dp[nt][e] = s[nt][e] * (dp[nt][e] - block_delta[r]);  // dSᵀ
      }
    }
    to_a_fragments(ds_frag, dp);
    Ops::accumulate_async(dk_acc, ds_frag, tile_q, lane);
    if (following >= 0) {
      wait_block(loads + 1, true);
      Ops::scores_async(s, s_k, s_q + (buf ^ 1) * Tile::kElements, lane);
      Ops::scores_async(dp, s_v, s_do + (buf ^ 1) * Tile::kElements, lane);
      Ops::template wait<2>(dv_acc, dk_acc);
    } else {
      Ops::template wait<0>(dv_acc, dk_acc);
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
    entry = following;
    ++loads;
  }
  // Nothing is in flight here: the last block took the wait<0> branch, and with no blocks nothing
  // was started. ptxas does not tie the exit test to those branches (to it the next block's scores
  // from the wait<2> branch may still be running), so without this wait it inserts the same one
  // here itself (ptxas info C7517).
  Ops::template wait<0>(dv_acc, dk_acc);

  const int64_t pos_a = key_position(p, block_tile, start, key_a);
  const int64_t pos_b = key_position(p, block_tile, start, key_b);
  const int64_t kv_stride = p.shape.kv_heads * D;
  const int64_t base = (b * p.keys) * kv_stride + static_cast<int64_t>(g) * D;
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    const int col = dt * 8 + 2 * (lane % 4);
    if (pos_a >= 0) {
      const int64_t at = base + pos_a * kv_stride + col;
      *reinterpret_cast<uint32_t*>(dk + at) =
          pack_bf16(dk_acc[dt][0] * p.scale, dk_acc[dt][1] * p.scale);
      *reinterpret_cast<uint32_t*>(dv + at) = pack_bf16(dv_acc[dt][0], dv_acc[dt][1]);
    }
    if (pos_b >= 0) {
      const int64_t at = base + pos_b * kv_stride + col;
      *reinterpret_cast<uint32_t*>(dk + at) =
          pack_bf16(dk_acc[dt][2] * p.scale, dk_acc[dt][3] * p.scale);
      *reinterpret_cast<uint32_t*>(dv + at) = pack_bf16(dv_acc[dt][2], dv_acc[dt][3]);
    }
  }
}

// TMA maps of k and v [B, S + N·bs, KVH, D] as 4-D tensors innermost first, in boxes of 64
// columns of one kv head's 64 keys; left empty for kernels that copy their tiles with cp.async.
template <int D, typename Ops>
cudaError_t key_value_maps(const Problem& p, const void* k, const void* v, CUtensorMap& key_map,
                           CUtensorMap& value_map) {
  key_map = CUtensorMap{};
  value_map = CUtensorMap{};
  if constexpr (!Ops::kTensorCopies) return cudaSuccess;
  const uint64_t row_bytes = static_cast<uint64_t>(D) * sizeof(bf16);
  const uint64_t dims[4] = {static_cast<uint64_t>(D), static_cast<uint64_t>(p.shape.kv_heads),
                            static_cast<uint64_t>(p.keys), static_cast<uint64_t>(p.shape.rows)};
  const uint64_t strides[3] = {row_bytes, row_bytes * p.shape.kv_heads,
                               row_bytes * p.shape.kv_heads * p.keys};
  const uint32_t box[4] = {64, 1, kKeys, 1};
  cudaError_t status = tma::encode_bf16_map(&key_map, k, dims, strides, box);
  if (status == cudaSuccess) status = tma::encode_bf16_map(&value_map, v, dims, strides, box);
  return status;
}

// The TMA map of a [B, N·bs, H, D] tensor (q, dout or out) as a 4-D tensor (D, positions, heads,
// rows), heads outside positions, so that a box of 64 columns × bs positions × group heads holds a
// CTA's query rows in load_query_tile's order (copy_query_tile_tma); left empty for kernels that
// copy their tiles with cp.async.
template <int D, typename Ops>
cudaError_t query_tile_map(const Problem& p, const void* tensor, CUtensorMap& map) {
  map = CUtensorMap{};
  if constexpr (!Ops::kTensorCopies) return cudaSuccess;
  const uint64_t row_bytes = static_cast<uint64_t>(D) * sizeof(bf16);
  const uint64_t dims[4] = {static_cast<uint64_t>(D), static_cast<uint64_t>(p.queries),
                            static_cast<uint64_t>(p.shape.heads),
                            static_cast<uint64_t>(p.shape.rows)};
  const uint64_t strides[3] = {row_bytes * p.shape.heads, row_bytes,
                               row_bytes * p.shape.heads * p.queries};
  const uint32_t box[4] = {64, static_cast<uint32_t>(p.shape.block_size),
                           static_cast<uint32_t>(p.group), 1};
  return tma::encode_bf16_map(&map, tensor, dims, strides, box);
}

template <int D, typename Ops>
cudaError_t launch_forward(const Problem& p, const void* q, const void* k, const void* v,
                           void* out, float* lse, cudaStream_t stream) {
  const size_t smem = 4 * Ops::Tile::kElements * sizeof(bf16) + Ops::kSmemSlack;
  cudaError_t status = cudaFuncSetAttribute(attention_forward_kernel<D, Ops>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (status != cudaSuccess) return status;
  const dim3 grid(static_cast<unsigned>(p.shape.kv_heads), static_cast<unsigned>(p.shape.rows),
                  static_cast<unsigned>(p.shape.blocks));
  CUtensorMap key_map, value_map, query_map;
  status = key_value_maps<D, Ops>(p, k, v, key_map, value_map);
  if (status == cudaSuccess) status = query_tile_map<D, Ops>(p, q, query_map);
  if (status != cudaSuccess) return status;
  attention_forward_kernel<D, Ops><<<grid, kThreads, smem, stream>>>(
      p, static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
      static_cast<bf16*>(out), lse, key_map, value_map, query_map);
  return cudaGetLastError();
}

// dq (with delta) and then dk/dv, which reads delta.
template <int D, typename Ops>
cudaError_t launch_gradients(const Problem& p, const void* q, const void* k, const void* v,
                             const void* out, const void* dout, const float* lse, float* delta,
                             void* dq, void* dk, void* dv, cudaStream_t stream) {
  const size_t dq_smem = 6 * Ops::Tile::kElements * sizeof(bf16) + Ops::kSmemSlack;
  cudaError_t status = cudaFuncSetAttribute(attention_dq_kernel<D, Ops>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, dq_smem);
  if (status != cudaSuccess) return status;
  const dim3 dq_grid(static_cast<unsigned>(p.shape.kv_heads), static_cast<unsigned>(p.shape.rows),
                     static_cast<unsigned>(p.shape.blocks));
  CUtensorMap key_map, value_map, query_map, dout_map, out_map;
  status = key_value_maps<D, Ops>(p, k, v, key_map, value_map);
  if (status == cudaSuccess) status = query_tile_map<D, Ops>(p, q, query_map);
  if (status == cudaSuccess) status = query_tile_map<D, Ops>(p, dout, dout_map);
  if (status == cudaSuccess) status = query_tile_map<D, Ops>(p, out, out_map);
  if (status != cudaSuccess) return status;
  attention_dq_kernel<D, Ops><<<dq_grid, kThreads, dq_smem, stream>>>(
      p, static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
      static_cast<const bf16*>(out), static_cast<const bf16*>(dout), lse, delta,
      static_cast<bf16*>(dq), key_map, value_map, query_map, dout_map, out_map);
  status = cudaGetLastError();
  if (status != cudaSuccess) return status;

  const size_t kv_smem =
      6 * Ops::Tile::kElements * sizeof(bf16) + 4 * kRows * sizeof(float) + Ops::kSmemSlack;
  status = cudaFuncSetAttribute(attention_dkdv_kernel<D, Ops>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, kv_smem);
  if (status != cudaSuccess) return status;
  const dim3 kv_grid(static_cast<unsigned>(p.shape.kv_heads), static_cast<unsigned>(p.shape.rows),
                     static_cast<unsigned>(p.context_tiles + p.shape.blocks));
  // dq's maps of q and dout serve the dk/dv pass too.
  attention_dkdv_kernel<D, Ops><<<kv_grid, kThreads, kv_smem, stream>>>(
      p, static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
      static_cast<const bf16*>(dout), lse, delta, static_cast<bf16*>(dk), static_cast<bf16*>(dv),
      query_map, dout_map);
  return cudaGetLastError();
}

template <int D>
cudaError_t forward_impl(const Problem& p, const void* q, const void* k, const void* v, void* out,
                         float* lse, bool use_wgmma, cudaStream_t stream) {
  if constexpr (D == 128) {
    if (use_wgmma) return launch_forward<D, WgmmaOps<D>>(p, q, k, v, out, lse, stream);
  }
  return launch_forward<D, MmaSyncOps<D>>(p, q, k, v, out, lse, stream);
}

template <int D>
cudaError_t backward_impl(const Problem& p, const void* q, const void* k, const void* v,
                          const void* out, const void* dout, const float* lse, float* delta,
                          void* dq, void* dk, void* dv, bool use_wgmma, cudaStream_t stream) {
  if constexpr (D == 128) {
    if (use_wgmma) {
      return launch_gradients<D, WgmmaOps<D>>(p, q, k, v, out, dout, lse, delta, dq, dk, dv,
                                              stream);
    }
  }
  return launch_gradients<D, MmaSyncOps<D>>(p, q, k, v, out, dout, lse, delta, dq, dk, dv,
                                             stream);
}

}  // namespace

bool block_attention_supported(const BlockAttentionShape& s) {
  if (s.rows < 1 || s.context < 0 || s.blocks < 1 || s.block_size < 1) return false;
  if (s.head_dim != 64 && s.head_dim != 128) return false;
  if (s.kv_heads < 1 || s.heads % s.kv_heads != 0) return false;
  if (s.block_size * (s.heads / s.kv_heads) > kRows) return false;
  // Grids are (kv head, row, block or key tile); y and z are limited to 65535.
  const int64_t key_tiles = (s.context + kKeys - 1) / kKeys + s.blocks;
  return s.rows <= 65535 && key_tiles <= 65535;
}

bool block_attention_wgmma_available(int64_t head_dim) {
  return head_dim == 128 && wgmma_available();
}

namespace {
// The instruction set a call runs: wgmma when asked for automatically and available.
bool uses_wgmma(const BlockAttentionShape& shape, AttentionInstructions instructions) {
  return instructions == AttentionInstructions::kAutomatic &&
         block_attention_wgmma_available(shape.head_dim);
}
}  // namespace

cudaError_t block_attention_forward(const BlockAttentionShape& shape, const void* q, const void* k,
                                    const void* v, const int64_t* anchors, const uint8_t* keep,
                                    float scale, void* out, float* lse, cudaStream_t stream,
                                    AttentionInstructions instructions) {
  // The forward's running maxima are taken on unscaled scores (softmax_tile).
  if (!block_attention_supported(shape) || !(scale > 0.f)) return cudaErrorInvalidValue;
  const Problem p = make_problem(shape, anchors, keep, scale);
  const bool use_wgmma = uses_wgmma(shape, instructions);
  return shape.head_dim == 128 ? forward_impl<128>(p, q, k, v, out, lse, use_wgmma, stream)
                               : forward_impl<64>(p, q, k, v, out, lse, false, stream);
}

cudaError_t block_attention_backward(const BlockAttentionShape& shape, const void* q,
                                     const void* k, const void* v, const void* out,
                                     const void* dout, const float* lse, const int64_t* anchors,
                                     const uint8_t* keep, float scale, float* delta, void* dq,
                                     void* dk, void* dv, cudaStream_t stream,
                                     AttentionInstructions instructions) {
  if (!block_attention_supported(shape)) return cudaErrorInvalidValue;
  const Problem p = make_problem(shape, anchors, keep, scale);
  const bool use_wgmma = uses_wgmma(shape, instructions);
  return shape.head_dim == 128
             ? backward_impl<128>(p, q, k, v, out, dout, lse, delta, dq, dk, dv, use_wgmma, stream)
             : backward_impl<64>(p, q, k, v, out, dout, lse, delta, dq, dk, dv, false, stream);
}

}  // namespace dspine::kernels
