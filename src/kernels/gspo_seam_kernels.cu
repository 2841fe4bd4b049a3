// Fused GSPO seam: see gspo_seam_kernels.h for the contract and docs/gspo.md ("The seam") for the
// math.
//
// Reduce runs one wave (as many blocks as fit on the device at once), each block owning a
// contiguous range of tokens that it walks in tiles of kTile: block 1 per token, then a
// block-wide segmented scan over runs of equal segment id. Runs that start and end inside a
// range are complete segments (contiguity contract) and are stored directly with their sums
// (U, V) and this rank's labelled count n and weight W = Σ w_t; the first and last run of each
// range may continue into a neighbour, so they go to a boundary list of 2 entries per block.
// Once every block has posted its entries (all blocks resident: a cooperative launch, and an
// integer ticket each waits on), each block sums the whole segments of its own two boundary runs
// from a shared-memory copy of the list, one warp each, in an order fixed by the list alone, so
// that every block needing a segment gets the same bits; the block holding a segment's last
// boundary run stores it. No block waits for another to combine: every sum is formed in an
// order fixed by the layout.
// Local seam: the same kernel also forms the loss and metric sums (each segment's terms where it
// is stored, the block partials added in block order by the block that stores last), and each
// block writes c_t for its own tokens from keys kept in shared memory — one kernel after the
// zeroing one, instead of a third launch whose start and end would cost more than the work.
// Otherwise finish forms c_t and the sums after the all-reduce.
// Measured on an H200, every dependent global round trip (a load that misses L1, an atomic, a
// grid's end before the next starts) costs about 0.5-1 µs, which at 1M tokens is as much as the
// data movement: the kernels are arranged to need few of them in a row.
#include "kernels/gspo_seam_kernels.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

namespace dspine::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kItems = 8;
constexpr int64_t kTile = int64_t(kThreads) * kItems;
// Upper bound of either grid (a wave is well below it on any current GPU); sizes the workspace.
constexpr int64_t kMaxBlocks = 512;
// Dynamic shared memory of a reduce block: the keys of its range when a local seam's range fits
// (up to 8192 tokens a block, about 2M tokens a wave on an H200; otherwise they go through the
// workspace), then a copy of the boundary list (2 entries of 20 bytes per block).
constexpr size_t kSharedKeyBytes = 32 * 1024;
constexpr size_t kSharedBytes = kSharedKeyBytes + 2 * kMaxBlocks * 20;
static_assert(2 * kMaxBlocks % kThreads == 0, "boundary list copied in whole rounds of the block");

// Word offsets into the workspace (every entry is 4 bytes). The head up to zeroed() is cleared
// first; the per-segment arrays are [U | V | W | n], U and V being the all-reduced [2, S] buffer.
struct Layout {
  int64_t segments;
  __host__ __device__ int64_t weight() const { return 2 * segments; }
  __host__ __device__ int64_t count() const { return 3 * segments; }
  __host__ __device__ int64_t writers() const { return 4 * segments; }
  __host__ __device__ int64_t status() const { return 5 * segments; }
  __host__ __device__ int64_t reduce_ticket() const { return status() + 1; }
  __host__ __device__ int64_t finish_ticket() const { return status() + 2; }
  __host__ __device__ int64_t combine_ticket() const { return status() + 3; }
  // End of the zeroed head, rounded up to whole 16-byte vectors.
  __host__ __device__ int64_t zeroed() const { return (status() + 4 + 3) / 4 * 4; }
  __host__ __device__ int64_t reduce_blocks() const { return zeroed(); }
  // Boundary list, 2 entries per reduce block: keys, then RunSums (4 words each), both 16-byte
  // aligned for vector loads.
  __host__ __device__ int64_t boundary_keys() const { return (reduce_blocks() + 1 + 3) / 4 * 4; }
  __host__ __device__ int64_t boundary_sums() const { return boundary_keys() + 2 * kMaxBlocks; }
  // Per reduce block, 16-byte aligned: loss, clipped and ratio terms (local seam) and Σ m·lp·w.
  __host__ __device__ int64_t reduce_partials() const { return boundary_sums() + 8 * kMaxBlocks; }
  // Per reduce block: loss, clipped and ratio terms of the segments it stored after combining.
  __host__ __device__ int64_t combine_partials() const { return reduce_partials() + 4 * kMaxBlocks; }
  __host__ __device__ int64_t finish_partials() const { return combine_partials() + 4 * kMaxBlocks; }
  // Per-token keys, 16-byte aligned for vector stores.
  __host__ __device__ int64_t keys() const { return (finish_partials() + 3 * kMaxBlocks + 3) / 4 * 4; }
};

// A block's token range: `per_block` tokens (a multiple of kItems, so every thread's first token
// keeps 16-byte alignment of the per-token arrays).
struct Grid {
  int64_t blocks, per_block;
};

Grid grid_for(int64_t num_tokens, int wave) {
  const int64_t chunks = std::max<int64_t>(1, (num_tokens + kItems - 1) / kItems);
  const int64_t tile_chunks = kTile / kItems;
  // No block gets less than a tile: short inputs use fewer blocks rather than idle threads.
  const int64_t blocks = std::min<int64_t>({int64_t(wave), kMaxBlocks, (chunks + tile_chunks - 1) / tile_chunks});
  const int64_t per_block = (chunks + blocks - 1) / blocks;
  return {(chunks + per_block - 1) / per_block, per_block * kItems};
}

// Blocked load of kItems consecutive inputs (read-only for the kernel's life) starting at this
// thread's slot of the tile.
template <typename T>
__device__ __forceinline__ void load_items(const T* base, int64_t first, int64_t end, T fill,
                                           T (&out)[kItems]) {
  const T* p = base + first;
  if (first + kItems <= end && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
    constexpr int kPerVector = 16 / sizeof(T);
#pragma unroll
    for (int i = 0; i < kItems; i += kPerVector) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p + i));
      memcpy(&out[i], &raw, sizeof(raw));
    }
  } else {
#pragma unroll
    for (int i = 0; i < kItems; ++i) out[i] = first + i < end ? p[i] : fill;
  }
}

template <typename T>
__device__ __forceinline__ void store_items(T* base, int64_t first, int64_t end,
                                            const T (&in)[kItems]) {
  T* p = base + first;
  if (first + kItems <= end && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
    constexpr int kPerVector = 16 / sizeof(T);
#pragma unroll
    for (int i = 0; i < kItems; i += kPerVector) {
      uint4 raw;
      memcpy(&raw, &in[i], sizeof(raw));
      *reinterpret_cast<uint4*>(p + i) = raw;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kItems; ++i)
      if (first + i < end) p[i] = in[i];
  }
}

// What a run accumulates: U, V, W = Σ w_t and the labelled count n.
struct RunSums {
  float u, v, w;
  int n;
  __device__ RunSums operator+(const RunSums& o) const { return {u + o.u, v + o.v, w + o.w, n + o.n}; }
};

// A run's partial sums in the segmented scan; `first` marks a run that began after no labelled
// token of the range (the range's first run, which may continue a neighbour's last run).
struct RunScan {
  int head, first;
  RunSums sums;
};
struct RunScanOp {
  __device__ RunScan operator()(const RunScan& a, const RunScan& b) const {
    return b.head ? b : RunScan{a.head, a.first, a.sums + b.sums};
  }
};
// Forward fill: masked tokens take the key of the last labelled token before them.
struct FillOp {
  __device__ int operator()(int a, int b) const { return b >= 0 ? b : a; }
};

struct Carry {
  int key, first;
  RunSums sums;
};

struct Quad {
  float a, b, c, d;
  __device__ Quad operator+(const Quad& o) const { return {a + o.a, b + o.b, c + o.c, d + o.d}; }
};
struct QuadSum {
  __device__ Quad operator()(const Quad& x, const Quad& y) const { return x + y; }
};

// A block's two runs that may continue into a neighbour's range (its first and its last run; key
// −1 when none), with the (U, V) of their whole segments once the boundary list is combined.
struct Edges {
  int key[2];
  float u[2], v[2];
};

struct ReduceShared {
  typename cub::BlockScan<int, kThreads>::TempStorage fill;
  typename cub::BlockScan<RunScan, kThreads>::TempStorage run;
  typename cub::BlockReduce<Quad, kThreads>::TempStorage reduce;
  int next_key[kThreads];
  Carry carry;
  int first_emitted;
  int first_key;
  Edges edges;
  Quad combine_terms[2];
  int is_last;
};

struct FinishShared {
  typename cub::BlockReduce<Quad, kThreads>::TempStorage reduce;
  int is_last;
};

// One tile of the segmented reduction: key −1 = no label (its sums are 0). Every complete run
// (one that ends before the tile's last item) is passed to emit(key, first, sums); the run open
// at the tile's end becomes the carry for the next tile.
template <typename Emit>
__device__ void reduce_tile(ReduceShared& sh, int (&key)[kItems], const RunSums (&item)[kItems],
                            Emit&& emit) {
  const Carry carry = sh.carry;
  int thread_last = -1;
#pragma unroll
  for (int i = 0; i < kItems; ++i) thread_last = key[i] >= 0 ? key[i] : thread_last;
  int prev;
  cub::BlockScan<int, kThreads>(sh.fill).ExclusiveScan(thread_last, prev, carry.key, FillOp());

  // A carried run that ended exactly at the previous tile's last item has no item here to
  // close it: emit it when this tile opens with another segment.
  if (threadIdx.x == 0 && carry.key >= 0 && key[0] >= 0 && key[0] != carry.key) {
    emit(carry.key, carry.first != 0, carry.sums);
  }

  RunScan scan[kItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int k = key[i] >= 0 ? key[i] : prev;
    scan[i] = RunScan{k != prev, prev < 0, item[i]};
    key[i] = k;
    prev = k;
  }
  const RunScanOp op;
  RunScan aggregate = scan[0];
#pragma unroll
  for (int i = 1; i < kItems; ++i) aggregate = op(aggregate, scan[i]);
  RunScan running;
  cub::BlockScan<RunScan, kThreads>(sh.run).ExclusiveScan(
      aggregate, running, RunScan{0, carry.first, carry.sums}, op);
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    running = op(running, scan[i]);
    scan[i] = running;
  }

  sh.next_key[threadIdx.x] = key[0];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    if (threadIdx.x == kThreads - 1 && i == kItems - 1) continue;
    const int next = i + 1 < kItems ? key[i + 1] : sh.next_key[threadIdx.x + 1];
    if (key[i] >= 0 && next != key[i]) emit(key[i], scan[i].first != 0, scan[i].sums);
  }
  __syncthreads();
  if (threadIdx.x == kThreads - 1) {
    const RunScan& last = scan[kItems - 1];
    sh.carry = Carry{key[kItems - 1], last.first, last.sums};
  }
  __syncthreads();
}

// A complete segment: its single writer stores every sum and counts itself in `writers`; a
// segment with two writers was split into two runs (a contract violation). Returns the writers
// before this one; a caller that does not use it leaves a fire-and-forget integer add, and a
// caller that does should read it late, so as not to wait for the round trip.
__device__ __forceinline__ int store_segment(float* ws, const Layout& layout, int key,
                                             const RunSums& sums) {
  ws[key] = sums.u;
  ws[layout.segments + key] = sums.v;
  ws[layout.weight() + key] = sums.w;
  ws[layout.count() + key] = static_cast<float>(sums.n);
  return atomicAdd(reinterpret_cast<int*>(ws + layout.writers()) + key, 1);
}

// A segment's share of the loss and metric sums (docs/gspo.md, "The seam"): n·ℓ, W·[R outside the
// clip range], W·R, with R = exp(U) and Ā = V (d unused).
__device__ __forceinline__ Quad segment_terms(float u, float advantage, float weight, float n,
                                              const GspoSeamScalars& scalars) {
  const float ratio = expf(u);
  const float lo = scalars.ratio_low, hi = scalars.ratio_high;
  const float clipped_ratio = fminf(fmaxf(ratio, lo), hi);
  return Quad{n * -fminf(ratio * advantage, clipped_ratio * advantage),
              weight * static_cast<float>(ratio < lo || ratio > hi), weight * ratio, 0.f};
}

// out[4] = {loss_sum, new_logprobs_sum, clipped_sum, ratio_sum} / D from the whole seam's sums
// (a: loss, b: clipped, c: ratio, d: Σ m·lp·w).
__device__ __forceinline__ void write_scalars(float* out, const Quad& total, float divisor) {
  out[0] = total.a / divisor;
  out[1] = total.d / divisor;
  out[2] = total.b / divisor;
  out[3] = total.c / divisor;
}

// Asks L2 for the line holding p (no register waits on it).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// A block's arrival after its last write that other blocks read. One acquire-release integer add
// by one thread orders the whole block's earlier writes (made visible to it by the barrier)
// before the ticket, and every other block's before the reads of the block that arrives last;
// returns true in every thread of that block. With `wait_all`, the other blocks also wait
// (acquire) for every block's arrival, which needs them all resident: a cooperative launch.
__device__ bool arrive(int& is_last, unsigned* ticket, bool wait_all) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned previous;
    asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], 1;" : "=r"(previous) : "l"(ticket) : "memory");
    is_last = previous == gridDim.x - 1;
    if (wait_all && !is_last)
      while (load_acquire(ticket) < gridDim.x) __nanosleep(32);
  }
  __syncthreads();
  return is_last != 0;
}

// The whole segment of the boundary run at `position` (key `key` >= 0): the sum of the runs with
// that key in the longest stretch of the list around it whose entries are that key or −1 (an
// empty or fully masked edge). One warp sums it in an order fixed by the stretch alone, so
// every block that needs the segment gets the same bits; every lane returns it, and `last` is
// the stretch's last run of that key.
__device__ RunSums chain_sums(const int* keys, const RunSums* sums, int64_t entries,
                              int64_t position, int key, int64_t& last) {
  const int lane = threadIdx.x % 32;
  // The farthest entry of `key` in one direction, 32 entries a step (lane 0 nearest).
  auto reach = [&](int step) {
    int64_t farthest = position;
    for (int64_t base = position + step;; base += 32 * step) {
      const int64_t j = base + step * lane;
      const int k = j >= 0 && j < entries ? keys[j] : -2;
      const unsigned breaks = __ballot_sync(~0u, k != key && k != -1);
      unsigned same = __ballot_sync(~0u, k == key);
      if (breaks != 0) same &= (breaks & (0u - breaks)) - 1;  // lanes before the first break
      if (same != 0) farthest = base + step * (31 - __clz(same));
      if (breaks != 0) return farthest;
    }
  };
  const int64_t first = reach(-1);
  last = reach(1);
  RunSums total{0.f, 0.f, 0.f, 0};
  for (int64_t j = first + lane; j <= last; j += 32)
    if (keys[j] == key) total = total + sums[j];
  // Butterfly: each step adds the same two values in every lane pair, so all lanes agree.
  for (int offset = 16; offset > 0; offset /= 2) {
    total.u += __shfl_xor_sync(~0u, total.u, offset);
    total.v += __shfl_xor_sync(~0u, total.v, offset);
    total.w += __shfl_xor_sync(~0u, total.w, offset);
    total.n += __shfl_xor_sync(~0u, total.n, offset);
  }
  return total;
}

// c_t = c̃_t·(g/D·λ) for the tokens [begin, end) from their keys (keys[0] is token `begin`'s)
// and the segments' (U, V), two tiles at a time so that twice as many loads are in flight per
// round trip. Every key was written by this same thread; the (U, V) of `edges` come with them,
// the others from the workspace (plain loads, not the read-only path: reduce may have stored
// them during this kernel, before a barrier that ordered them).
__device__ void write_coefficients(const float* ws, const Layout& layout,
                                   const GspoSeamScalars& scalars, float* coefficient,
                                   int64_t begin, int64_t end, const int* keys, const Edges& edges) {
  constexpr int kTiles = 2;
  for (int64_t tile = begin; tile < end; tile += kTiles * kTile) {
    int key[kTiles][kItems];
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      const int64_t first = tile + t * kTile + int64_t(threadIdx.x) * kItems;
      if (first + kItems <= end) {
#pragma unroll
        for (int i = 0; i < kItems; i += 4) {
          const int4 four = *reinterpret_cast<const int4*>(keys + (first - begin) + i);
          key[t][i] = four.x;
          key[t][i + 1] = four.y;
          key[t][i + 2] = four.z;
          key[t][i + 3] = four.w;
        }
      } else {
#pragma unroll
        for (int i = 0; i < kItems; ++i) key[t][i] = first + i < end ? keys[first - begin + i] : -1;
      }
    }
    float u[kTiles][kItems], advantage[kTiles][kItems];
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const int k = key[t][i];
        u[t][i] = k < 0                 ? 0.f
                  : k == edges.key[0]   ? edges.u[0]
                  : k == edges.key[1]   ? edges.u[1]
                                        : ws[k];
        advantage[t][i] = k < 0               ? 0.f
                          : k == edges.key[0] ? edges.v[0]
                          : k == edges.key[1] ? edges.v[1]
                                              : ws[layout.segments + k];
      }
    }
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      const int64_t first = tile + t * kTile + int64_t(threadIdx.x) * kItems;
      float c[kItems];
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const float ratio = expf(u[t][i]);
        const float a = advantage[t][i];
        const float c_tilde = (fmaxf(a, 0.f) * static_cast<float>(ratio <= scalars.ratio_high) +
                               fminf(a, 0.f) * static_cast<float>(ratio >= scalars.ratio_low)) *
                              ratio;
        c[i] = key[t][i] >= 0 ? c_tilde * scalars.coefficient_scale : 0.f;
      }
      store_items(coefficient, first, end, c);
    }
  }
}

// True if a segment of this block's slice of [0, S) has two writers (split into two runs).
__device__ bool split_in_slice(const float* ws, const Layout& layout) {
  const int64_t per_block = (layout.segments + gridDim.x - 1) / gridDim.x;
  const int64_t begin = int64_t(blockIdx.x) * per_block;
  const int64_t end = min(layout.segments, begin + per_block);
  const int* writers = reinterpret_cast<const int*>(ws + layout.writers());
  bool split = false;
  for (int64_t s = begin + threadIdx.x; s < end; s += kThreads) split = split || writers[s] > 1;
  return split;
}

// Zeroes the workspace head and lets reduce start at once: reduce reads its inputs and scans its
// first tile while this runs, and waits for it only before its first store into the head.
__global__ void __launch_bounds__(kThreads) seam_prepare_kernel(uint4* head, int64_t vectors) {
  cudaTriggerProgrammaticLaunchCompletion();
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < vectors;
       i += int64_t(gridDim.x) * kThreads)
    head[i] = make_uint4(0, 0, 0, 0);
}

// `out` non-null: the seam is local (no all-reduce follows), and this kernel is the whole of
// block 2 as well: each block writes c_t for its tokens (when `coefficient` is non-null) from the
// stored segments and its edges' sums, and checks its slice of segments for splits; the block
// that stores last adds the loss and metric sums into out[4]. `keys_in_shared`: the keys stay in
// this block's dynamic shared memory (its range fits) instead of the workspace.
template <typename Seg, typename Count>
__global__ void __launch_bounds__(kThreads, 2)
    seam_reduce_kernel(GspoSeamTokens tokens, GspoSeamScalars scalars, float* ws, float* out,
                       float* coefficient, int64_t per_block, bool keys_in_shared) {
  __shared__ ReduceShared sh;
  extern __shared__ int4 shared_keys[];
  const Layout layout{tokens.num_segments};
  const int64_t num_segments = tokens.num_segments;
  const int64_t begin = int64_t(blockIdx.x) * per_block;
  const int64_t end = min(tokens.num_tokens, begin + per_block);
  const auto* segment = static_cast<const Seg*>(tokens.segment);
  const auto* counts = static_cast<const Count*>(tokens.label_counts);
  const bool with_sums = out != nullptr;
  // Keys of this range (keys_out[0] is token `begin`'s); a local seam without c_t needs none.
  int* keys_out = keys_in_shared ? reinterpret_cast<int*>(shared_keys)
                                 : reinterpret_cast<int*>(ws + layout.keys()) + begin;
  const bool keep_keys = !with_sums || coefficient != nullptr;
  int* status = reinterpret_cast<int*>(ws + layout.status());
  int* boundary_keys = reinterpret_cast<int*>(ws + layout.boundary_keys());
  auto* boundary_sums = reinterpret_cast<RunSums*>(ws + layout.boundary_sums());
  if (threadIdx.x == 0) {
    sh.carry = Carry{-1, 1, {0.f, 0.f, 0.f, 0}};
    sh.first_emitted = 0;
  }
  __syncthreads();

  auto to_boundary = [&](int64_t slot, int key, const RunSums& sums) {
    boundary_keys[slot] = key;
    boundary_sums[slot] = sums;
  };
  // A complete segment: stored, and its terms added to this thread's share when reduce sums.
  Quad terms{0.f, 0.f, 0.f, 0.f};  // d: Σ m·lp·w
  auto complete = [&](int key, const RunSums& sums) {
    store_segment(ws, layout, key, sums);
    if (with_sums) terms = terms + segment_terms(sums.u, sums.v, sums.w, float(sums.n), scalars);
  };

  int bad = 0;
  for (int64_t tile = begin; tile < end; tile += kTile) {
    const int64_t first = tile + int64_t(threadIdx.x) * kItems;
    // The next tile streams into L2 while this one is scanned.
    const int64_t ahead = first + kTile;
    if (ahead < end) {
      prefetch_l2(tokens.target + ahead);
      prefetch_l2(segment + ahead);
      prefetch_l2(counts + ahead);
      prefetch_l2(tokens.logprobs + ahead);
      prefetch_l2(tokens.old_logprobs + ahead);
      prefetch_l2(tokens.advantages + ahead);
    }
    int64_t target[kItems];
    Seg seg[kItems];
    Count count[kItems];
    float lp[kItems], old[kItems], adv[kItems];
    load_items(tokens.target, first, end, int64_t(-1), target);
    load_items(segment, first, end, Seg(0), seg);
    load_items(counts, first, end, Count(0), count);
    load_items(tokens.logprobs, first, end, 0.f, lp);
    load_items(tokens.old_logprobs, first, end, 0.f, old);
    load_items(tokens.advantages, first, end, 0.f, adv);
    int key[kItems];
    RunSums item[kItems];
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      key[i] = -1;
      item[i] = RunSums{0.f, 0.f, 0.f, 0};
      if (target[i] < 0) continue;  // masked: selected away, whatever its values
      const float n = static_cast<float>(count[i]);
      const float w = 1.0f / fmaxf(n, 1.0f);
      if (!isfinite(lp[i]) || !isfinite(old[i]) || !isfinite(adv[i]) || !isfinite(n))
        bad |= kGspoNonFinite;
      terms.d += lp[i] * w;
      const int64_t s = static_cast<int64_t>(seg[i]);
      if (s < 0 || s >= num_segments) {
        bad |= kGspoBadSegment;
        continue;
      }
      key[i] = static_cast<int>(s);
      item[i] = RunSums{(lp[i] - old[i]) * w, adv[i] * w, w, 1};
    }
    if (keep_keys) store_items(keys_out, first - begin, end - begin, key);  // outside the zeroed head
    if (tile == begin) cudaGridDependencySynchronize();  // the head has been zeroed
    reduce_tile(sh, key, item, [&](int k, bool first_run, const RunSums& sums) {
      if (first_run) {  // may continue the previous range's last run: boundary slot 0
        to_boundary(2 * int64_t(blockIdx.x), k, sums);
        sh.first_emitted = 1;
        sh.first_key = k;
      } else {
        complete(k, sums);
      }
    });
  }
  cudaGridDependencySynchronize();  // (a block without tokens has not waited yet)
  if (bad) atomicOr(status, bad);
  if (threadIdx.x == 0) {
    // The run open at the range's end goes to slot 1 (slot 0 when it is also the first run).
    const Carry c = sh.carry;
    const int64_t slot = 2 * int64_t(blockIdx.x) + (sh.first_emitted ? 1 : 0);
    // Slots 0 and 1 are distinct runs with other runs between them; the combine below would
    // merge them if they shared a key, so a split segment is caught here.
    if (sh.first_emitted && c.key == sh.first_key) atomicOr(status, kGspoSplitSegment);
    if (!sh.first_emitted) boundary_keys[2 * int64_t(blockIdx.x) + 1] = -1;
    to_boundary(slot, c.key, c.key >= 0 ? c.sums : RunSums{0.f, 0.f, 0.f, 0});
    sh.edges = Edges{{sh.first_emitted ? sh.first_key : c.key, sh.first_emitted ? c.key : -1},
                     {0.f, 0.f}, {0.f, 0.f}};
    if (blockIdx.x == 0) reinterpret_cast<int*>(ws)[layout.reduce_blocks()] = gridDim.x;
  }
  const Quad block_terms = cub::BlockReduce<Quad, kThreads>(sh.reduce).Reduce(terms, QuadSum());
  if (threadIdx.x == 0)
    reinterpret_cast<float4*>(ws + layout.reduce_partials())[blockIdx.x] =
        make_float4(block_terms.a, block_terms.b, block_terms.c, block_terms.d);

  // Finish may be launched now; it waits for this grid's completion before reading anything.
  cudaTriggerProgrammaticLaunchCompletion();
  arrive(sh.is_last, reinterpret_cast<unsigned*>(ws + layout.reduce_ticket()), /*wait_all=*/true);

  // Every boundary run is posted: the list into shared memory, then one warp per edge of this
  // block finds its whole segment. The block holding a segment's last boundary run stores it
  // (a segment another writer stored first is a split one) and adds its loss terms.
  const int64_t entries = 2 * int64_t(gridDim.x);
  auto* list_sums = reinterpret_cast<RunSums*>(reinterpret_cast<char*>(shared_keys) + kSharedKeyBytes);
  int* list_keys = reinterpret_cast<int*>(list_sums + entries);
  {  // all loads in flight before the first store, one round trip
    constexpr int kPerThread = int(2 * kMaxBlocks / kThreads);
    int key_in[kPerThread];
    float4 raw_in[kPerThread];
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      const int64_t j = threadIdx.x + int64_t(r) * kThreads;
      if (j < entries) {
        key_in[r] = __ldcg(boundary_keys + j);
        raw_in[r] = __ldcg(reinterpret_cast<const float4*>(boundary_sums + j));
      }
    }
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      const int64_t j = threadIdx.x + int64_t(r) * kThreads;
      if (j < entries) {
        list_keys[j] = key_in[r];
        list_sums[j] = RunSums{raw_in[r].x, raw_in[r].y, raw_in[r].z, __float_as_int(raw_in[r].w)};
      }
    }
  }
  __syncthreads();
  const int warp = threadIdx.x / 32;
  int earlier_writers = 0;  // of the segment this block stores after combining: 0 unless split
  if (warp < 2) {
    const int64_t position = 2 * int64_t(blockIdx.x) + warp;
    const int key = list_keys[position];
    Quad edge_terms{0.f, 0.f, 0.f, 0.f};
    if (key >= 0) {
      int64_t chain_end;
      const RunSums sums = chain_sums(list_keys, list_sums, entries, position, key, chain_end);
      if (threadIdx.x % 32 == 0) {
        sh.edges.u[warp] = sums.u;
        sh.edges.v[warp] = sums.v;
        if (chain_end == position) {
          earlier_writers = store_segment(ws, layout, key, sums);
          if (with_sums) edge_terms = segment_terms(sums.u, sums.v, sums.w, float(sums.n), scalars);
        }
      }
    }
    if (threadIdx.x % 32 == 0) sh.combine_terms[warp] = edge_terms;
  }
  if (!with_sums) {
    if (earlier_writers != 0) atomicOr(status, kGspoSplitSegment);
    return;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const Quad t = sh.combine_terms[0] + sh.combine_terms[1];
    reinterpret_cast<float4*>(ws + layout.combine_partials())[blockIdx.x] = make_float4(t.a, t.b, t.c, 0.f);
  }
  // The block that stores last adds every block's partials, in block order, into out[4].
  if (arrive(sh.is_last, reinterpret_cast<unsigned*>(ws + layout.combine_ticket()), false)) {
    Quad total{0.f, 0.f, 0.f, 0.f};
    for (int64_t b = threadIdx.x; b < gridDim.x; b += kThreads) {
      const float4 p = __ldcg(reinterpret_cast<const float4*>(ws + layout.reduce_partials()) + b);
      const float4 q = __ldcg(reinterpret_cast<const float4*>(ws + layout.combine_partials()) + b);
      total = total + Quad{p.x + q.x, p.y + q.y, p.z + q.z, p.w};
    }
    total = cub::BlockReduce<Quad, kThreads>(sh.reduce).Reduce(total, QuadSum());
    if (threadIdx.x == 0) write_scalars(out, total, scalars.divisor);
  }
  // Local seam: every segment this block's tokens belong to is stored or among its edges.
  if (coefficient != nullptr)
    write_coefficients(ws, layout, scalars, coefficient, begin, end, keys_out, sh.edges);
  if (earlier_writers != 0 || split_in_slice(ws, layout)) atomicOr(status, kGspoSplitSegment);
}

// Block 2 after the all-reduce (a seam whose segments span ranks): c_t for every token (when
// `coefficient` is non-null), the split check over a slice of the segments, and the loss and
// metric sums per segment, added by the last block.
__global__ void __launch_bounds__(kThreads)
    seam_finish_kernel(int64_t num_tokens, int64_t num_segments, GspoSeamScalars scalars,
                       float* ws, float* coefficient, float* out, int64_t per_block) {
  __shared__ FinishShared sh;
  const Layout layout{num_segments};
  // Everything read below was written by reduce or by the all-reduce after it.
  cudaGridDependencySynchronize();
  if (coefficient != nullptr) {
    const int64_t begin = int64_t(blockIdx.x) * per_block;
    write_coefficients(ws, layout, scalars, coefficient, begin, min(num_tokens, begin + per_block),
                       reinterpret_cast<const int*>(ws + layout.keys()) + begin,
                       Edges{{-1, -1}, {0.f, 0.f}, {0.f, 0.f}});
  }
  if (split_in_slice(ws, layout))
    atomicOr(reinterpret_cast<int*>(ws + layout.status()), kGspoSplitSegment);

  // Segment sums: this block's slice, each thread taking a fixed stride of it.
  const int64_t per_block_segments = (num_segments + gridDim.x - 1) / gridDim.x;
  const int64_t seg_begin = int64_t(blockIdx.x) * per_block_segments;
  const int64_t seg_end = min(num_segments, seg_begin + per_block_segments);
  Quad sums{0.f, 0.f, 0.f, 0.f};
  for (int64_t s = seg_begin + threadIdx.x; s < seg_end; s += kThreads) {
    const float n = __ldg(ws + layout.count() + s);
    if (n != 0.f)
      sums = sums + segment_terms(__ldg(ws + s), __ldg(ws + num_segments + s),
                                  __ldg(ws + layout.weight() + s), n, scalars);
  }
  const Quad block_sums = cub::BlockReduce<Quad, kThreads>(sh.reduce).Reduce(sums, QuadSum());
  if (threadIdx.x == 0) {
    float* partial = ws + layout.finish_partials() + 3 * int64_t(blockIdx.x);
    partial[0] = block_sums.a;
    partial[1] = block_sums.b;
    partial[2] = block_sums.c;
  }
  if (!arrive(sh.is_last, reinterpret_cast<unsigned*>(ws + layout.finish_ticket()), false)) return;

  // The last block: every block's partials in block order, and reduce's Σ m·lp·w partials (d).
  Quad total{0.f, 0.f, 0.f, 0.f};
  for (int64_t b = threadIdx.x; b < gridDim.x; b += kThreads) {
    const float* partial = ws + layout.finish_partials() + 3 * b;
    total = total + Quad{__ldcg(partial), __ldcg(partial + 1), __ldcg(partial + 2), 0.f};
  }
  const int reduce_blocks = __ldcg(reinterpret_cast<const int*>(ws) + layout.reduce_blocks());
  for (int64_t b = threadIdx.x; b < reduce_blocks; b += kThreads)
    total.d += __ldcg(ws + layout.reduce_partials() + 4 * b + 3);
  __syncthreads();
  total = cub::BlockReduce<Quad, kThreads>(sh.reduce).Reduce(total, QuadSum());
  if (threadIdx.x == 0) write_scalars(out, total, scalars.divisor);
}

// Blocks of `kernel` resident on the whole device at once (one wave).
template <typename Kernel>
int wave_blocks(Kernel kernel, size_t dynamic_shared = 0) {
  int device = 0, sms = 0, per_sm = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (dynamic_shared > 48 * 1024)
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dynamic_shared));
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, dynamic_shared);
  return std::max(1, sms * std::max(1, per_sm));
}

// Calls f with a null pointer of each (segment, count) element type, for template dispatch.
template <typename F>
cudaError_t dispatch(const GspoSeamTokens& tokens, F&& f) {
  auto by_count = [&](auto seg) -> cudaError_t {
    switch (tokens.count_type) {
      case GspoCountType::kInt32: return f(seg, static_cast<int32_t*>(nullptr));
      case GspoCountType::kInt64: return f(seg, static_cast<int64_t*>(nullptr));
      case GspoCountType::kFloat32: return f(seg, static_cast<float*>(nullptr));
    }
    return cudaErrorInvalidValue;
  };
  return tokens.segment_type == GspoIndexType::kInt32 ? by_count(static_cast<int32_t*>(nullptr))
                                                      : by_count(static_cast<int64_t*>(nullptr));
}

// Launches `kernel` so that it may start while the previous kernel on `stream` is still running
// (programmatic dependent launch); the kernel calls cudaGridDependencySynchronize() before it
// touches anything that kernel writes. `cooperative`: all blocks are resident at once.
template <typename... Params, typename... Args>
cudaError_t launch_overlapped(void (*kernel)(Params...), int64_t blocks, bool cooperative,
                              size_t dynamic_shared, cudaStream_t stream, Args... args) {
  cudaLaunchAttribute attributes[2] = {};
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = 1;
  attributes[1].id = cudaLaunchAttributeCooperative;
  attributes[1].val.cooperative = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = dynamic_shared;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = cooperative ? 2 : 1;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

}  // namespace

size_t gspo_seam_workspace_bytes(int64_t num_tokens, int64_t num_segments) {
  return size_t(Layout{num_segments}.keys() + std::max<int64_t>(num_tokens, 0)) * 4;
}

int64_t gspo_seam_status_offset(int64_t num_segments) { return Layout{num_segments}.status(); }

namespace {

// Zeroes the workspace head, then launches reduce, which overlaps the zeroing. `out` non-null:
// the local seam (cooperative launch, block 2 included).
cudaError_t prepare_and_reduce(const GspoSeamTokens& tokens, const GspoSeamScalars& scalars,
                               void* workspace, float* coefficient, float* out,
                               cudaStream_t stream) {
  const int64_t vectors = Layout{tokens.num_segments}.zeroed() / 4;
  const int64_t prepare_blocks = std::clamp<int64_t>((vectors + kThreads - 1) / kThreads, 1, 1024);
  seam_prepare_kernel<<<unsigned(prepare_blocks), kThreads, 0, stream>>>(
      static_cast<uint4*>(workspace), vectors);
  if (const cudaError_t error = cudaGetLastError(); error != cudaSuccess) return error;
  return dispatch(tokens, [&](auto* seg, auto* count) {
    using Seg = std::remove_pointer_t<decltype(seg)>;
    using Count = std::remove_pointer_t<decltype(count)>;
    static const int wave = wave_blocks(seam_reduce_kernel<Seg, Count>, kSharedBytes);
    const Grid grid = grid_for(tokens.num_tokens, wave);
    const bool keys_in_shared = out != nullptr && grid.per_block * 4 <= int64_t(kSharedKeyBytes);
    return launch_overlapped(seam_reduce_kernel<Seg, Count>, grid.blocks, /*cooperative=*/true,
                             kSharedBytes, stream, tokens, scalars,
                             static_cast<float*>(workspace), out, coefficient, grid.per_block,
                             keys_in_shared);
  });
}

}  // namespace

cudaError_t gspo_seam_local(const GspoSeamTokens& tokens, const GspoSeamScalars& scalars,
                            void* workspace, float* coefficient, float* scalars_out,
                            cudaStream_t stream) {
  return prepare_and_reduce(tokens, scalars, workspace, coefficient, scalars_out, stream);
}

cudaError_t gspo_seam_reduce(const GspoSeamTokens& tokens, void* workspace, cudaStream_t stream) {
  return prepare_and_reduce(tokens, GspoSeamScalars{}, workspace, nullptr, nullptr, stream);
}

cudaError_t gspo_seam_finish(const GspoSeamTokens& tokens, const GspoSeamScalars& scalars,
                             void* workspace, float* coefficient, float* scalars_out,
                             cudaStream_t stream) {
  static const int wave = wave_blocks(seam_finish_kernel);
  const Grid grid = grid_for(tokens.num_tokens, wave);
  return launch_overlapped(seam_finish_kernel, grid.blocks, false, 0, stream, tokens.num_tokens,
                           tokens.num_segments, scalars, static_cast<float*>(workspace),
                           coefficient, scalars_out, grid.per_block);
}

}  // namespace dspine::kernels
