// Fused GSPO seam: see gspo_seam.h for the contract and gspo.md §2 for the math.
//
// Reduce kernel: each block owns a contiguous range of tokens (whole tiles of kTile tokens) and
// reduces it by runs of equal segment id with a block-wide segmented scan. Runs that start and
// end inside the range are complete segments (contiguity contract) and are stored directly;
// the first and last run of each range may continue into a neighbour, so they go to a boundary
// list of 2 entries per block. The last block to finish (integer ticket) reduces that list with
// the same segmented scan, in block order: every sum is formed in an order fixed by the layout.
// Besides (U_s, V_s) each run stores this rank's labelled count n_s and weight W_s = Σ w_t, and
// every token's key (segment id, −1 when masked) is written as one int.
// Finish kernel: the loss / metric sums are per segment (Σ_t m_t·ℓ_t = Σ_s n_s·ℓ_s, and the
// w-weighted metrics use W_s), so tokens are not reread for them; the per-token pass only turns
// each key into c_t (4 bytes read, 4 written) and is skipped in forward-only calls. The last
// block combines the per-block partials.
#include "kernels/gspo_seam.h"

#include <cstring>
#include <type_traits>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

namespace dspine::kernels {
namespace {

constexpr int kThreads = 256;
// The reduce kernel's register budget is sized for this many blocks per SM, so that its grid
// (at most kMaxBlocks blocks) is resident in one wave on a 132-SM H200 up to 1M tokens.
constexpr int kMinBlocks = 4;
constexpr int kItems = 8;
constexpr int64_t kTile = int64_t(kThreads) * kItems;
// Bounds the boundary list (2 entries per block) to one tile of the combining block.
constexpr int64_t kMaxBlocks = kTile / 2;

// Word offsets into the workspace (every entry is 4 bytes).
struct Layout {
  int64_t segments, blocks, tokens;
  __host__ __device__ int64_t weights() const { return 2 * segments; }  // W_s (float)
  __host__ __device__ int64_t counts() const { return 3 * segments; }   // n_s (int), the writers
  __host__ __device__ int64_t status() const { return 4 * segments; }
  __host__ __device__ int64_t reduce_ticket() const { return status() + 1; }
  __host__ __device__ int64_t finish_ticket() const { return status() + 2; }
  __host__ __device__ int64_t zeroed() const { return status() + 3; }
  __host__ __device__ int64_t boundary_keys() const { return zeroed(); }
  __host__ __device__ int64_t boundary_u() const { return boundary_keys() + 2 * blocks; }
  __host__ __device__ int64_t boundary_v() const { return boundary_u() + 2 * blocks; }
  __host__ __device__ int64_t boundary_w() const { return boundary_v() + 2 * blocks; }
  __host__ __device__ int64_t boundary_n() const { return boundary_w() + 2 * blocks; }
  __host__ __device__ int64_t logprob_partials() const { return boundary_n() + 2 * blocks; }
  __host__ __device__ int64_t finish_partials() const { return logprob_partials() + blocks; }
  // Per-token keys start on a 16-byte boundary (relative to the workspace) for vector access.
  __host__ __device__ int64_t keys() const { return (finish_partials() + 3 * blocks + 3) / 4 * 4; }
  __host__ __device__ int64_t total() const { return keys() + tokens; }
};

struct Grid {
  int64_t blocks, tiles_per_block;
};

Grid grid_for(int64_t num_tokens) {
  const int64_t tiles = num_tokens > 0 ? (num_tokens + kTile - 1) / kTile : 1;
  const int64_t per_block = (tiles + kMaxBlocks - 1) / kMaxBlocks;
  return {(tiles + per_block - 1) / per_block, per_block};
}

// Blocked load of kItems consecutive elements starting at this thread's slot of the tile.
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

// Blocked store of kItems consecutive elements starting at this thread's slot of the tile.
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

// A run's partial sums in the segmented scan; `first` marks a run that began after no labelled
// token of the range (the range's first run, which may continue a neighbour's last run).
struct RunScan {
  int head, first, n;
  float u, v, w;
};
struct RunScanOp {
  __device__ RunScan operator()(const RunScan& a, const RunScan& b) const {
    return b.head ? b : RunScan{a.head, a.first, a.n + b.n, a.u + b.u, a.v + b.v, a.w + b.w};
  }
};
// Forward fill: masked tokens take the key of the last labelled token before them.
struct FillOp {
  __device__ int operator()(int a, int b) const { return b >= 0 ? b : a; }
};

struct Carry {
  int key, first, n;
  float u, v, w;
};
constexpr Carry kNoCarry{-1, 1, 0, 0.f, 0.f, 0.f};

struct Triple {
  float a, b, c;
};
struct TripleSum {
  __device__ Triple operator()(const Triple& x, const Triple& y) const {
    return {x.a + y.a, x.b + y.b, x.c + y.c};
  }
};

struct SeamShared {
  typename cub::BlockScan<int, kThreads>::TempStorage fill;
  typename cub::BlockScan<RunScan, kThreads>::TempStorage run;
  typename cub::BlockReduce<float, kThreads>::TempStorage reduce;
  typename cub::BlockReduce<Triple, kThreads>::TempStorage reduce3;
  int next_key[kThreads];
  Carry carry;
  int first_emitted;
  int first_key;
  int is_last;
};

// One tile of the segmented reduction: key -1 = no label (its n, u, v, w are 0). Every complete
// run (one that ends before the tile's last item) is passed to emit(key, first, run); the run
// open at the tile's end becomes the carry for the next tile.
template <typename Emit>
__device__ void reduce_tile(SeamShared& sh, int (&key)[kItems], const int (&n)[kItems],
                            const float (&u)[kItems], const float (&v)[kItems],
                            const float (&w)[kItems], Emit&& emit) {
  const Carry carry = sh.carry;
  int thread_last = -1;
#pragma unroll
  for (int i = 0; i < kItems; ++i) thread_last = key[i] >= 0 ? key[i] : thread_last;
  int prev;
  cub::BlockScan<int, kThreads>(sh.fill).ExclusiveScan(thread_last, prev, carry.key, FillOp());

  RunScan items[kItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int k = key[i] >= 0 ? key[i] : prev;
    items[i] = RunScan{k != prev, prev < 0, n[i], u[i], v[i], w[i]};
    key[i] = k;
    prev = k;
  }
  const RunScanOp op;
  RunScan aggregate = items[0];
#pragma unroll
  for (int i = 1; i < kItems; ++i) aggregate = op(aggregate, items[i]);
  RunScan running;
  cub::BlockScan<RunScan, kThreads>(sh.run).ExclusiveScan(
      aggregate, running, RunScan{0, carry.first, carry.n, carry.u, carry.v, carry.w}, op);
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    running = op(running, items[i]);
    items[i] = running;
  }

  sh.next_key[threadIdx.x] = key[0];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    if (threadIdx.x == kThreads - 1 && i == kItems - 1) continue;
    const int next = i + 1 < kItems ? key[i + 1] : sh.next_key[threadIdx.x + 1];
    if (key[i] >= 0 && next != key[i]) emit(key[i], items[i].first != 0, items[i]);
  }
  __syncthreads();
  if (threadIdx.x == kThreads - 1) {
    const RunScan& last = items[kItems - 1];
    sh.carry = Carry{key[kItems - 1], last.first, last.n, last.u, last.v, last.w};
  }
  __syncthreads();
}

// A complete segment: its single writer stores the sums. A run holds at least one labelled
// token, so a nonzero count already there means a second writer: the segment was split into
// two runs (contract violation), flagged, and its values are not trusted.
__device__ __forceinline__ void store_segment(float* ws, const Layout& layout, int key, int n,
                                              float u, float v, float w) {
  ws[key] = u;
  ws[layout.segments + key] = v;
  ws[layout.weights() + key] = w;
  int* counts = reinterpret_cast<int*>(ws + layout.counts());
  if (atomicAdd(counts + key, n) != 0)
    atomicOr(reinterpret_cast<int*>(ws + layout.status()), kGspoSplitSegment);
}

// Returns true in every thread of the block that finished last (after all others' writes).
__device__ bool last_block_done(SeamShared& sh, unsigned* ticket) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) sh.is_last = atomicAdd(ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  if (sh.is_last) __threadfence();
  return sh.is_last != 0;
}

template <typename Seg, typename Count>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    seam_reduce_kernel(GspoSeamTokens tokens, float* ws, int64_t tiles_per_block) {
  __shared__ SeamShared sh;
  const Layout layout{tokens.num_segments, gridDim.x, tokens.num_tokens};
  const int64_t num_segments = tokens.num_segments;
  const int64_t begin = int64_t(blockIdx.x) * tiles_per_block * kTile;
  const int64_t end = min(tokens.num_tokens, begin + tiles_per_block * kTile);
  const auto* segment = static_cast<const Seg*>(tokens.segment);
  const auto* counts = static_cast<const Count*>(tokens.label_counts);
  int* token_keys = reinterpret_cast<int*>(ws + layout.keys());
  int* boundary_keys = reinterpret_cast<int*>(ws + layout.boundary_keys());
  int* boundary_n = reinterpret_cast<int*>(ws + layout.boundary_n());
  float* boundary_u = ws + layout.boundary_u();
  float* boundary_v = ws + layout.boundary_v();
  float* boundary_w = ws + layout.boundary_w();
  auto set_boundary = [&](int64_t slot, int key, const RunScan& run) {
    boundary_keys[slot] = key;
    boundary_n[slot] = run.n;
    boundary_u[slot] = run.u;
    boundary_v[slot] = run.v;
    boundary_w[slot] = run.w;
  };
  if (threadIdx.x == 0) {
    sh.carry = kNoCarry;
    sh.first_emitted = 0;
  }
  __syncthreads();

  float logprob_sum = 0.f;
  int bad = 0;
  for (int64_t tile = begin; tile < end; tile += kTile) {
    const int64_t first = tile + int64_t(threadIdx.x) * kItems;
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
    int key[kItems], n[kItems];
    float u[kItems], v[kItems], w[kItems];
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      key[i] = -1;
      n[i] = 0;
      u[i] = 0.f;
      v[i] = 0.f;
      w[i] = 0.f;
      if (target[i] < 0) continue;  // masked: selected away, whatever its values
      const float count_i = static_cast<float>(count[i]);
      const float weight = 1.0f / fmaxf(count_i, 1.0f);
      if (!isfinite(lp[i]) || !isfinite(old[i]) || !isfinite(adv[i]) || !isfinite(count_i))
        bad |= kGspoNonFinite;
      logprob_sum += lp[i] * weight;
      const int64_t s = static_cast<int64_t>(seg[i]);
      if (s < 0 || s >= num_segments) {
        bad |= kGspoBadSegment;
        continue;
      }
      key[i] = static_cast<int>(s);
      n[i] = 1;
      u[i] = (lp[i] - old[i]) * weight;
      v[i] = adv[i] * weight;
      w[i] = weight;
    }
    store_items(token_keys, first, end, key);
    reduce_tile(sh, key, n, u, v, w, [&](int k, bool first_run, const RunScan& run) {
      if (first_run) {  // may continue the previous range's last run: boundary slot 0
        set_boundary(2 * int64_t(blockIdx.x), k, run);
        sh.first_emitted = 1;
        sh.first_key = k;
      } else {
        store_segment(ws, layout, k, run.n, run.u, run.v, run.w);
      }
    });
  }
  if (bad) atomicOr(reinterpret_cast<int*>(ws + layout.status()), bad);
  if (threadIdx.x == 0) {
    // The run open at the range's end goes to slot 1 (slot 0 when it is also the first run).
    const Carry c = sh.carry;
    const int64_t slot = 2 * int64_t(blockIdx.x) + (sh.first_emitted ? 1 : 0);
    // Slots 0 and 1 are distinct runs with other runs between them; the combine below would
    // merge them if they shared a key, so a split segment is caught here.
    if (sh.first_emitted && c.key == sh.first_key)
      atomicOr(reinterpret_cast<int*>(ws + layout.status()), kGspoSplitSegment);
    if (!sh.first_emitted) boundary_keys[2 * blockIdx.x + 1] = -1;
    const bool open = c.key >= 0;
    set_boundary(slot, c.key,
                 RunScan{0, 0, open ? c.n : 0, open ? c.u : 0.f, open ? c.v : 0.f, open ? c.w : 0.f});
  }
  const float block_sum = cub::BlockReduce<float, kThreads>(sh.reduce).Sum(logprob_sum);
  if (threadIdx.x == 0) ws[layout.logprob_partials() + blockIdx.x] = block_sum;

  if (!last_block_done(sh, reinterpret_cast<unsigned*>(ws + layout.reduce_ticket()))) return;

  // The last block: runs in the boundary list, in block order, are complete segments.
  if (threadIdx.x == 0) sh.carry = kNoCarry;
  __syncthreads();
  const int64_t entries = 2 * int64_t(gridDim.x);
  for (int64_t tile = 0; tile < entries; tile += kTile) {
    int key[kItems], n[kItems];
    float u[kItems], v[kItems], w[kItems];
    const int64_t first = tile + int64_t(threadIdx.x) * kItems;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const bool in = first + i < entries;
      key[i] = in ? __ldcg(boundary_keys + first + i) : -1;
      const bool live = in && key[i] >= 0;
      n[i] = live ? __ldcg(boundary_n + first + i) : 0;
      u[i] = live ? __ldcg(boundary_u + first + i) : 0.f;
      v[i] = live ? __ldcg(boundary_v + first + i) : 0.f;
      w[i] = live ? __ldcg(boundary_w + first + i) : 0.f;
    }
    reduce_tile(sh, key, n, u, v, w, [&](int k, bool, const RunScan& run) {
      store_segment(ws, layout, k, run.n, run.u, run.v, run.w);
    });
  }
  if (threadIdx.x == 0 && sh.carry.key >= 0) {
    const Carry c = sh.carry;
    store_segment(ws, layout, c.key, c.n, c.u, c.v, c.w);
  }
}

__global__ void __launch_bounds__(kThreads)
    seam_finish_kernel(int64_t num_tokens, int64_t num_segments, GspoSeamScalars scalars,
                       float* ws, float* coefficient, float* out, int64_t tiles_per_block) {
  __shared__ SeamShared sh;
  const Layout layout{num_segments, gridDim.x, num_tokens};
  const float lo = scalars.ratio_low;
  const float hi = scalars.ratio_high;
  const int* segment_counts = reinterpret_cast<const int*>(ws + layout.counts());

  // Loss and metrics per segment, over this block's slice of the segments: a segment with no
  // labelled token on this rank contributes nothing (selected away, whatever its sums).
  const int64_t per_block = (num_segments + gridDim.x - 1) / gridDim.x;
  const int64_t segment_end = min(num_segments, (int64_t(blockIdx.x) + 1) * per_block);
  Triple sums{0.f, 0.f, 0.f};  // loss, clipped, ratio
  for (int64_t s = int64_t(blockIdx.x) * per_block + threadIdx.x; s < segment_end; s += kThreads) {
    const int n = __ldg(segment_counts + s);
    if (n == 0) continue;
    const float ratio = expf(__ldg(ws + s));
    const float advantage = __ldg(ws + num_segments + s);
    const float weight = __ldg(ws + layout.weights() + s);
    const float clipped_ratio = fminf(fmaxf(ratio, lo), hi);
    sums.a += static_cast<float>(n) * -fminf(ratio * advantage, clipped_ratio * advantage);
    sums.b += weight * static_cast<float>(ratio < lo || ratio > hi);
    sums.c += weight * ratio;
  }

  // c_t from each token's key: the same (U_s, V_s) gather for every token of a segment.
  if (coefficient != nullptr) {
    const int* token_keys = reinterpret_cast<const int*>(ws + layout.keys());
    const int64_t begin = int64_t(blockIdx.x) * tiles_per_block * kTile;
    const int64_t end = min(num_tokens, begin + tiles_per_block * kTile);
    for (int64_t tile = begin; tile < end; tile += kTile) {
      const int64_t first = tile + int64_t(threadIdx.x) * kItems;
      int key[kItems];
      load_items(token_keys, first, end, -1, key);
      float c[kItems];
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        c[i] = 0.f;
        if (key[i] < 0) continue;
        const float ratio = expf(__ldg(ws + key[i]));
        const float advantage = __ldg(ws + num_segments + key[i]);
        const float c_tilde = (fmaxf(advantage, 0.f) * static_cast<float>(ratio <= hi) +
                               fminf(advantage, 0.f) * static_cast<float>(ratio >= lo)) *
                              ratio;
        c[i] = c_tilde * scalars.coefficient_scale;
      }
      store_items(coefficient, first, end, c);
    }
  }

  const Triple block_sums = cub::BlockReduce<Triple, kThreads>(sh.reduce3).Reduce(sums, TripleSum());
  if (threadIdx.x == 0) {
    float* partial = ws + layout.finish_partials() + 3 * int64_t(blockIdx.x);
    partial[0] = block_sums.a;
    partial[1] = block_sums.b;
    partial[2] = block_sums.c;
  }
  if (!last_block_done(sh, reinterpret_cast<unsigned*>(ws + layout.finish_ticket()))) return;

  // The reduce kernel ran on the same grid: its per-block log-prob partials are combined here.
  Triple total{0.f, 0.f, 0.f};
  float logprob = 0.f;
  for (int64_t b = threadIdx.x; b < gridDim.x; b += kThreads) {
    const float* partial = ws + layout.finish_partials() + 3 * b;
    total = TripleSum()(total, Triple{__ldcg(partial), __ldcg(partial + 1), __ldcg(partial + 2)});
    logprob += __ldcg(ws + layout.logprob_partials() + b);
  }
  __syncthreads();
  total = cub::BlockReduce<Triple, kThreads>(sh.reduce3).Reduce(total, TripleSum());
  __syncthreads();
  logprob = cub::BlockReduce<float, kThreads>(sh.reduce).Sum(logprob);
  if (threadIdx.x == 0) {
    out[0] = total.a / scalars.divisor;
    out[1] = logprob / scalars.divisor;
    out[2] = total.b / scalars.divisor;
    out[3] = total.c / scalars.divisor;
  }
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

}  // namespace

size_t gspo_seam_workspace_bytes(int64_t num_tokens, int64_t num_segments) {
  return size_t(Layout{num_segments, grid_for(num_tokens).blocks, num_tokens}.total()) * 4;
}

int64_t gspo_seam_status_offset(int64_t num_segments) { return Layout{num_segments, 0, 0}.status(); }

cudaError_t gspo_seam_prepare(void* workspace, int64_t num_tokens, int64_t num_segments,
                              cudaStream_t stream) {
  const Layout layout{num_segments, grid_for(num_tokens).blocks, num_tokens};
  return cudaMemsetAsync(workspace, 0, size_t(layout.zeroed()) * 4, stream);
}

cudaError_t gspo_seam_reduce(const GspoSeamTokens& tokens, void* workspace, cudaStream_t stream) {
  const Grid grid = grid_for(tokens.num_tokens);
  return dispatch(tokens, [&](auto* seg, auto* count) {
    using Seg = std::remove_pointer_t<decltype(seg)>;
    using Count = std::remove_pointer_t<decltype(count)>;
    seam_reduce_kernel<Seg, Count><<<grid.blocks, kThreads, 0, stream>>>(
        tokens, static_cast<float*>(workspace), grid.tiles_per_block);
    return cudaGetLastError();
  });
}

cudaError_t gspo_seam_finish(const GspoSeamTokens& tokens, const GspoSeamScalars& scalars,
                             void* workspace, float* coefficient, float* scalars_out,
                             cudaStream_t stream) {
  const Grid grid = grid_for(tokens.num_tokens);
  seam_finish_kernel<<<grid.blocks, kThreads, 0, stream>>>(
      tokens.num_tokens, tokens.num_segments, scalars, static_cast<float*>(workspace), coefficient,
      scalars_out, grid.tiles_per_block);
  return cudaGetLastError();
}

}  // namespace dspine::kernels
