// Fused GSPO seam: see gspo_seam.h for the contract and gspo.md §2 for the math.
//
// Reduce kernel: each block owns a contiguous range of tokens (whole tiles of kTile tokens) and
// reduces it by runs of equal segment id with a block-wide segmented scan. Runs that start and
// end inside the range are complete segments (contiguity contract) and are stored directly;
// the first and last run of each range may continue into a neighbour, so they go to a boundary
// list of 2 entries per block. The last block to finish (integer ticket) reduces that list with
// the same segmented scan, in block order: every sum is formed in an order fixed by the layout.
// Finish kernel: one pass over the tokens gathering (U_s, V_s) from the L2-resident buffer, with
// the same last-block pattern for the loss / metric sums.
#include "kernels/gspo_seam.h"

#include <cstring>
#include <type_traits>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

namespace dspine::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kItems = 8;
constexpr int64_t kTile = int64_t(kThreads) * kItems;
// Bounds the boundary list (2 entries per block) to one tile of the combining block.
constexpr int64_t kMaxBlocks = kTile / 2;

// Word offsets into the workspace (every entry is 4 bytes).
struct Layout {
  int64_t segments, blocks;
  __host__ __device__ int64_t writers() const { return 2 * segments; }
  __host__ __device__ int64_t status() const { return 3 * segments; }
  __host__ __device__ int64_t reduce_ticket() const { return status() + 1; }
  __host__ __device__ int64_t finish_ticket() const { return status() + 2; }
  __host__ __device__ int64_t logprob_total() const { return status() + 3; }
  __host__ __device__ int64_t zeroed() const { return status() + 4; }
  __host__ __device__ int64_t boundary_keys() const { return zeroed(); }
  __host__ __device__ int64_t boundary_u() const { return boundary_keys() + 2 * blocks; }
  __host__ __device__ int64_t boundary_v() const { return boundary_u() + 2 * blocks; }
  __host__ __device__ int64_t logprob_partials() const { return boundary_v() + 2 * blocks; }
  __host__ __device__ int64_t finish_partials() const { return logprob_partials() + blocks; }
  __host__ __device__ int64_t total() const { return finish_partials() + 3 * blocks; }
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

// A run's partial sums in the segmented scan; `first` marks a run that began after no labelled
// token of the range (the range's first run, which may continue a neighbour's last run).
struct RunScan {
  int head, first;
  float u, v;
};
struct RunScanOp {
  __device__ RunScan operator()(const RunScan& a, const RunScan& b) const {
    return b.head ? b : RunScan{a.head, a.first, a.u + b.u, a.v + b.v};
  }
};
// Forward fill: masked tokens take the key of the last labelled token before them.
struct FillOp {
  __device__ int operator()(int a, int b) const { return b >= 0 ? b : a; }
};

struct Carry {
  int key, first;
  float u, v;
};

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

// One tile of the segmented reduction: key -1 = no label (its u, v are 0). Every complete run
// (one that ends before the tile's last item) is passed to emit(key, first, u, v); the run open
// at the tile's end becomes the carry for the next tile.
template <typename Emit>
__device__ void reduce_tile(SeamShared& sh, int (&key)[kItems], const float (&u)[kItems],
                            const float (&v)[kItems], Emit&& emit) {
  const Carry carry = sh.carry;
  int thread_last = -1;
#pragma unroll
  for (int i = 0; i < kItems; ++i) thread_last = key[i] >= 0 ? key[i] : thread_last;
  int prev;
  cub::BlockScan<int, kThreads>(sh.fill).ExclusiveScan(thread_last, prev, carry.key, FillOp());

  // A carried run that ended exactly at the previous tile's last item has no item here to
  // close it: emit it when this tile opens with another segment.
  if (threadIdx.x == 0 && carry.key >= 0 && key[0] >= 0 && key[0] != carry.key) {
    emit(carry.key, carry.first != 0, carry.u, carry.v);
  }

  RunScan items[kItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int k = key[i] >= 0 ? key[i] : prev;
    items[i] = RunScan{k != prev, prev < 0, u[i], v[i]};
    key[i] = k;
    prev = k;
  }
  const RunScanOp op;
  RunScan aggregate = items[0];
#pragma unroll
  for (int i = 1; i < kItems; ++i) aggregate = op(aggregate, items[i]);
  RunScan running;
  cub::BlockScan<RunScan, kThreads>(sh.run).ExclusiveScan(
      aggregate, running, RunScan{0, carry.first, carry.u, carry.v}, op);
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
    if (key[i] >= 0 && next != key[i]) emit(key[i], items[i].first != 0, items[i].u, items[i].v);
  }
  __syncthreads();
  if (threadIdx.x == kThreads - 1) {
    const RunScan& last = items[kItems - 1];
    sh.carry = Carry{key[kItems - 1], last.first, last.u, last.v};
  }
  __syncthreads();
}

// A complete segment: its single writer stores both sums. A second writer means the segment was
// split into two runs (contract violation): flagged, and the value is not trusted.
__device__ __forceinline__ void store_segment(float* ws, const Layout& layout, int key, float u,
                                              float v) {
  ws[key] = u;
  ws[layout.segments + key] = v;
  int* writers = reinterpret_cast<int*>(ws + layout.writers());
  if (atomicAdd(writers + key, 1) != 0)
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
__global__ void __launch_bounds__(kThreads)
    seam_reduce_kernel(GspoSeamTokens tokens, float* ws, int64_t tiles_per_block) {
  __shared__ SeamShared sh;
  const Layout layout{tokens.num_segments, gridDim.x};
  const int64_t num_segments = tokens.num_segments;
  const int64_t begin = int64_t(blockIdx.x) * tiles_per_block * kTile;
  const int64_t end = min(tokens.num_tokens, begin + tiles_per_block * kTile);
  const auto* segment = static_cast<const Seg*>(tokens.segment);
  const auto* counts = static_cast<const Count*>(tokens.label_counts);
  int* boundary_keys = reinterpret_cast<int*>(ws + layout.boundary_keys());
  float* boundary_u = ws + layout.boundary_u();
  float* boundary_v = ws + layout.boundary_v();
  if (threadIdx.x == 0) {
    sh.carry = Carry{-1, 1, 0.f, 0.f};
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
    int key[kItems];
    float u[kItems], v[kItems];
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      key[i] = -1;
      u[i] = 0.f;
      v[i] = 0.f;
      if (target[i] < 0) continue;  // masked: selected away, whatever its values
      const float n = static_cast<float>(count[i]);
      const float w = 1.0f / fmaxf(n, 1.0f);
      if (!isfinite(lp[i]) || !isfinite(old[i]) || !isfinite(adv[i]) || !isfinite(n))
        bad |= kGspoNonFinite;
      logprob_sum += lp[i] * w;
      const int64_t s = static_cast<int64_t>(seg[i]);
      if (s < 0 || s >= num_segments) {
        bad |= kGspoBadSegment;
        continue;
      }
      key[i] = static_cast<int>(s);
      u[i] = (lp[i] - old[i]) * w;
      v[i] = adv[i] * w;
    }
    reduce_tile(sh, key, u, v, [&](int k, bool first_run, float su, float sv) {
      if (first_run) {  // may continue the previous range's last run: boundary slot 0
        boundary_keys[2 * blockIdx.x] = k;
        boundary_u[2 * blockIdx.x] = su;
        boundary_v[2 * blockIdx.x] = sv;
        sh.first_emitted = 1;
        sh.first_key = k;
      } else {
        store_segment(ws, layout, k, su, sv);
      }
    });
  }
  if (bad) atomicOr(reinterpret_cast<int*>(ws + layout.status()), bad);
  if (threadIdx.x == 0) {
    // The run open at the range's end goes to slot 1 (slot 0 when it is also the first run).
    const Carry c = sh.carry;
    const int slot = sh.first_emitted ? 1 : 0;
    // Slots 0 and 1 are distinct runs with other runs between them; the combine below would
    // merge them if they shared a key, so a split segment is caught here.
    if (sh.first_emitted && c.key == sh.first_key)
      atomicOr(reinterpret_cast<int*>(ws + layout.status()), kGspoSplitSegment);
    if (!sh.first_emitted) boundary_keys[2 * blockIdx.x + 1] = -1;
    boundary_keys[2 * blockIdx.x + slot] = c.key;
    boundary_u[2 * blockIdx.x + slot] = c.key >= 0 ? c.u : 0.f;
    boundary_v[2 * blockIdx.x + slot] = c.key >= 0 ? c.v : 0.f;
  }
  const float block_sum = cub::BlockReduce<float, kThreads>(sh.reduce).Sum(logprob_sum);
  if (threadIdx.x == 0) ws[layout.logprob_partials() + blockIdx.x] = block_sum;

  if (!last_block_done(sh, reinterpret_cast<unsigned*>(ws + layout.reduce_ticket()))) return;

  // The last block: runs in the boundary list, in block order, are complete segments.
  if (threadIdx.x == 0) sh.carry = Carry{-1, 1, 0.f, 0.f};
  __syncthreads();
  const int64_t entries = 2 * int64_t(gridDim.x);
  for (int64_t tile = 0; tile < entries; tile += kTile) {
    int key[kItems];
    float u[kItems], v[kItems];
    const int64_t first = tile + int64_t(threadIdx.x) * kItems;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const bool in = first + i < entries;
      key[i] = in ? __ldcg(boundary_keys + first + i) : -1;
      u[i] = in && key[i] >= 0 ? __ldcg(boundary_u + first + i) : 0.f;
      v[i] = in && key[i] >= 0 ? __ldcg(boundary_v + first + i) : 0.f;
    }
    reduce_tile(sh, key, u, v,
                [&](int k, bool, float su, float sv) { store_segment(ws, layout, k, su, sv); });
  }
  if (threadIdx.x == 0 && sh.carry.key >= 0)
    store_segment(ws, layout, sh.carry.key, sh.carry.u, sh.carry.v);

  float partial = 0.f;
  for (int64_t b = threadIdx.x; b < gridDim.x; b += kThreads)
    partial += __ldcg(ws + layout.logprob_partials() + b);
  __syncthreads();
  const float total = cub::BlockReduce<float, kThreads>(sh.reduce).Sum(partial);
  if (threadIdx.x == 0) ws[layout.logprob_total()] = total;
}

template <typename Seg, typename Count>
__global__ void __launch_bounds__(kThreads)
    seam_finish_kernel(GspoSeamTokens tokens, GspoSeamScalars scalars, float* ws,
                       float* coefficient, float* out, int64_t tiles_per_block) {
  __shared__ SeamShared sh;
  const Layout layout{tokens.num_segments, gridDim.x};
  const int64_t num_segments = tokens.num_segments;
  const int64_t begin = int64_t(blockIdx.x) * tiles_per_block * kTile;
  const int64_t end = min(tokens.num_tokens, begin + tiles_per_block * kTile);
  const auto* segment = static_cast<const Seg*>(tokens.segment);
  const auto* counts = static_cast<const Count*>(tokens.label_counts);
  const float lo = scalars.ratio_low;
  const float hi = scalars.ratio_high;

  Triple sums{0.f, 0.f, 0.f};  // loss, clipped, ratio
  for (int64_t tile = begin; tile < end; tile += kTile) {
    const int64_t first = tile + int64_t(threadIdx.x) * kItems;
    int64_t target[kItems];
    Seg seg[kItems];
    Count count[kItems];
    load_items(tokens.target, first, end, int64_t(-1), target);
    load_items(segment, first, end, Seg(0), seg);
    load_items(counts, first, end, Count(0), count);
    float c[kItems];
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      c[i] = 0.f;
      const int64_t s = static_cast<int64_t>(seg[i]);
      if (target[i] < 0 || s < 0 || s >= num_segments) continue;
      const float ratio = expf(__ldg(ws + s));
      const float advantage = __ldg(ws + num_segments + s);
      const float w = 1.0f / fmaxf(static_cast<float>(count[i]), 1.0f);
      const float clipped_ratio = fminf(fmaxf(ratio, lo), hi);
      sums.a += -fminf(ratio * advantage, clipped_ratio * advantage);
      sums.b += w * static_cast<float>(ratio < lo || ratio > hi);
      sums.c += w * ratio;
      const float c_tilde = (fmaxf(advantage, 0.f) * static_cast<float>(ratio <= hi) +
                             fminf(advantage, 0.f) * static_cast<float>(ratio >= lo)) *
                            ratio;
      c[i] = c_tilde * scalars.coefficient_scale;
    }
    if (coefficient != nullptr) {
      float* p = coefficient + first;
      if (first + kItems <= end && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
#pragma unroll
        for (int i = 0; i < kItems; i += 4)
          *reinterpret_cast<float4*>(p + i) = make_float4(c[i], c[i + 1], c[i + 2], c[i + 3]);
      } else {
#pragma unroll
        for (int i = 0; i < kItems; ++i)
          if (first + i < end) p[i] = c[i];
      }
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

  Triple total{0.f, 0.f, 0.f};
  for (int64_t b = threadIdx.x; b < gridDim.x; b += kThreads) {
    const float* partial = ws + layout.finish_partials() + 3 * b;
    total = TripleSum()(total, Triple{__ldcg(partial), __ldcg(partial + 1), __ldcg(partial + 2)});
  }
  __syncthreads();
  total = cub::BlockReduce<Triple, kThreads>(sh.reduce3).Reduce(total, TripleSum());
  if (threadIdx.x == 0) {
    out[0] = total.a / scalars.divisor;
    out[1] = __ldcg(ws + layout.logprob_total()) / scalars.divisor;
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
  return size_t(Layout{num_segments, grid_for(num_tokens).blocks}.total()) * 4;
}

int64_t gspo_seam_status_offset(int64_t num_segments) { return Layout{num_segments, 0}.status(); }

cudaError_t gspo_seam_prepare(void* workspace, int64_t num_tokens, int64_t num_segments,
                              cudaStream_t stream) {
  const Layout layout{num_segments, grid_for(num_tokens).blocks};
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
  return dispatch(tokens, [&](auto* seg, auto* count) {
    using Seg = std::remove_pointer_t<decltype(seg)>;
    using Count = std::remove_pointer_t<decltype(count)>;
    seam_finish_kernel<Seg, Count><<<grid.blocks, kThreads, 0, stream>>>(
        tokens, scalars, static_cast<float*>(workspace), coefficient, scalars_out,
        grid.tiles_per_block);
    return cudaGetLastError();
  });
}

}  // namespace dspine::kernels
