// Fused vocabulary objective row kernels: see vocab_objective.h. Memory-bound: each pass reads the
// row's z (and t) in 16-byte packs, kUnroll packs of each in flight per thread, and folds a pack
// into the running statistics with one rescale (its own maximum first). Two forms:
//   cluster   a thread-block cluster per row, each block keeping its slice of z and t in shared
//             memory from pass 1 on, so passes 2 and 3 read no global memory (the teacher form,
//             whenever a slice fits: the recipe's bf16 rows of 151,936 in four blocks);
//   streaming one block per row reading the row from global memory in every pass (the rest).
// Block and cluster reductions run in a fixed order, so results are deterministic.
#include "kernels/vocab_objective.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cmath>
#include <type_traits>

#include "kernels/norm_swiglu_common.cuh"
#include "kernels/vocab_topk.cuh"

namespace dspine::kernels {
namespace {

using detail::load_pack;
using detail::Pack;
using detail::pack_from_floats;
using detail::store_pack;
using detail::to_float;

constexpr int kThreads = 256;  // the streaming kernel's block
constexpr int kWarps = kThreads / 32;
constexpr int kClusterThreads = 512;  // the cluster kernel's block: one per SM at the recipe
constexpr int kClusterWarps = kClusterThreads / 32;
constexpr int kMaxClusterBlocks = 8;  // the portable cluster size
// Shared memory a block's slice of z and t may take (an SM has 228 KB).
constexpr int64_t kSliceBytes = int64_t(200) << 10;
constexpr int kUnroll = 4;
constexpr int64_t kNoIndex = INT64_MAX;
static_assert(kVocabMaxTopK <= detail::kWarpLanes);

// for_each_pack's default step: nothing.
struct NoStep {
  template <typename P>
  __device__ void operator()(int64_t, const P&, bool) const {}
};

// Elements in a pack type (references included).
template <typename P>
constexpr int pack_size = std::extent_v<decltype(std::declval<P>().v)>;

// Calls f(first element index, z pack, t pack) over a row: N-element packs, then the scalar tail.
// Without a teacher the t pack is z's. After each f, step(first element index, z pack, valid) runs
// with the whole warp converged (valid: whether this lane had a pack), for warp-collective work;
// a warp's steps come in increasing element order, lane order within a step.
template <typename T, int N, bool kTeacher, int Threads = kThreads, typename F,
          typename Step = NoStep>
__device__ __forceinline__ void for_each_pack(const T* z, const T* t, int64_t vocab, F&& f,
                                              Step&& step = {}) {
  static_assert(pack_size<const Pack<T, N>&> == N && pack_size<Pack<T, 1>> == 1);
  const int64_t packs = vocab / N;
  const int lane = threadIdx.x % 32;
  // The loop conditions test the warp's first lane, so that every lane takes each step.
  for (int64_t j = threadIdx.x; j - lane < packs; j += int64_t(Threads) * kUnroll) {
    Pack<T, N> zp[kUnroll], tp[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = j + int64_t(u) * Threads;
      if (v < packs) {
        zp[u] = load_pack<T, N>(z + v * N);
        tp[u] = kTeacher ? load_pack<T, N>(t + v * N) : zp[u];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = j + int64_t(u) * Threads;
      if (v < packs) f(v * N, zp[u], tp[u]);
      step(v * N, zp[u], v < packs);
    }
  }
  for (int64_t i = packs * N + threadIdx.x; i - lane < vocab; i += Threads) {
    Pack<T, 1> zs, ts;
    if (i < vocab) {
      zs.v[0] = z[i];
      ts.v[0] = kTeacher ? t[i] : z[i];
      f(i, zs, ts);
    }
    step(i, zs, i < vocab);
  }
}

// Running softmax statistics (m = max, s = Σ exp(x − m)) merged with (m2, s2).
__device__ __forceinline__ void merge_stats(float& m, float& s, float m2, float s2) {
  const float top = fmaxf(m, m2);
  if (top == -INFINITY) return;
  s = s * __expf(m - top) + s2 * __expf(m2 - top);
  m = top;
}

// Folds n values into (m, s) with one rescale: their maximum first, then the exponentials.
template <int n>
__device__ __forceinline__ void add_values(float& m, float& s, const float (&x)[n]) {
  float top = m;
#pragma unroll
  for (int e = 0; e < n; ++e) top = fmaxf(top, x[e]);
  if (top == -INFINITY) return;
  s *= __expf(m - top);
  m = top;
#pragma unroll
  for (int e = 0; e < n; ++e) s += __expf(x[e] - m);
}

// (v2, i2) wins over (v, i): larger value, ties to the first index (as torch's argmax).
__device__ __forceinline__ void merge_argmax(float& v, int64_t& i, float v2, int64_t i2) {
  if (v2 > v || (v2 == v && i2 < i)) {
    v = v2;
    i = i2;
  }
}

// Block-wide fold of the pair (a, b) by merge(a, b, a2, b2), returned to every thread; (a0, b0)
// is merge's identity and (sa, sb) hold one pair per warp.
template <typename A, typename B, typename Merge>
__device__ __forceinline__ void block_fold(A& a, B& b, A a0, B b0, A* sa, B* sb, Merge merge) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    merge(a, b, __shfl_xor_sync(0xffffffffu, a, offset), __shfl_xor_sync(0xffffffffu, b, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sa[warp] = a;
    sb[warp] = b;
  }
  __syncthreads();
  a = a0;
  b = b0;
  for (int w = 0; w < int(blockDim.x / 32); ++w) merge(a, b, sa[w], sb[w]);
  __syncthreads();  // the scratch is reused
}

// The same fold over a cluster's blocks, after block_fold (every thread holds its block's pair):
// in rank order from the identity, so every block gets the same result. `slot_a`/`slot_b` are
// one shared pair per block.
template <typename A, typename B, typename Merge>
__device__ __forceinline__ void cluster_fold(A& a, B& b, A a0, B b0, A* slot_a, B* slot_b,
                                             Merge merge) {
  auto cluster = cooperative_groups::this_cluster();
  if (threadIdx.x == 0) {
    *slot_a = a;
    *slot_b = b;
  }
  cluster.sync();
  a = a0;
  b = b0;
  for (unsigned rank = 0; rank < cluster.num_blocks(); ++rank) {
    merge(a, b, *cluster.map_shared_rank(slot_a, rank), *cluster.map_shared_rank(slot_b, rank));
  }
  cluster.sync();  // no block leaves, or reuses its slots, while another reads them
}

struct StatsMerge {
  __device__ void operator()(float& m1, float& s1, float m2, float s2) const {
    merge_stats(m1, s1, m2, s2);
  }
};
struct ArgmaxMerge {
  __device__ void operator()(float& v1, int64_t& i1, float v2, int64_t i2) const {
    merge_argmax(v1, i1, v2, i2);
  }
};
struct SumsMerge {
  __device__ void operator()(float& a1, float& b1, float a2, float b2) const {
    a1 += a2;
    b1 += b2;
  }
};

__device__ __forceinline__ void block_stats(float& m, float& s, float* sm, float* ss) {
  block_fold(m, s, -INFINITY, 0.f, sm, ss, StatsMerge{});
}

__device__ __forceinline__ void block_argmax(float& v, int64_t& i, float* sv, int64_t* si) {
  block_fold(v, i, -INFINITY, kNoIndex, sv, si, ArgmaxMerge{});
}

// log(Σ exp) from (m, s), the logarithm in double: it is taken once per row.
__device__ __forceinline__ float log_sum_exp(float m, float s) {
  return static_cast<float>(double(m) + log(double(s)));
}

__device__ __forceinline__ float sign_of(float d) {
  return static_cast<float>((d > 0.f) - (d < 0.f));
}

template <typename T, int N, bool kTeacher, bool kGradient>
__global__ void __launch_bounds__(kThreads)
    vocab_rows_kernel(VocabRows rows, VocabRowStats stats, VocabGradient gradient) {
  __shared__ float scratch_a[kWarps], scratch_b[kWarps];
  __shared__ int64_t scratch_index[kWarps];
  __shared__ uint64_t top_lists[kWarps * detail::kWarpLanes];
  const int64_t row = blockIdx.x;
  T* z = static_cast<T*>(rows.draft) + row * rows.row_stride;
  const T* t = kTeacher ? static_cast<const T*>(rows.teacher) + row * rows.row_stride : nullptr;
  const int64_t y = rows.labels[row];

  // Pass 1: softmax statistics of z (and t), argmax and top-k of z.
  float mz = -INFINITY, sz = 0.f, mt = -INFINITY, st = 0.f, best = -INFINITY;
  int64_t best_index = kNoIndex;
  const int top_k = stats.top_k;
  detail::WarpTopK top(top_k);
  auto statistics = [&](int64_t i, const auto& zp, const auto& tp) {
    constexpr int n = pack_size<decltype(zp)>;
    float zv[n], tv[n];
#pragma unroll
    for (int e = 0; e < n; ++e) {
      zv[e] = to_float(zp.v[e]);
      tv[e] = to_float(tp.v[e]);
    }
    if (top_k == 0) {  // else the argmax is the first candidate
#pragma unroll
      for (int e = 0; e < n; ++e) merge_argmax(best, best_index, zv[e], i + e);
    }
    add_values(mz, sz, zv);
    if constexpr (kTeacher) add_values(mt, st, tv);
  };
  auto select = [&](int64_t i, const auto& zp, bool valid) {
    if (top_k == 0) return;
    constexpr int n = pack_size<decltype(zp)>;
    float zv[n];
#pragma unroll
    for (int e = 0; e < n; ++e) zv[e] = to_float(zp.v[e]);
    top.offer(zv, i, valid);
  };
  for_each_pack<T, N, kTeacher>(z, t, rows.vocab, statistics, select);
  block_stats(mz, sz, scratch_a, scratch_b);
  if constexpr (kTeacher) block_stats(mt, st, scratch_a, scratch_b);
  if (top_k > 0) {
    top.merge_block(top_lists);
    best_index = top.index();  // thread 0 holds the first candidate
  } else {
    block_argmax(best, best_index, scratch_a, scratch_index);
  }
  const float lse_z = log_sum_exp(mz, sz);
  const float lse_t = kTeacher ? log_sum_exp(mt, st) : 0.f;
  // z_y is read before any thread can reach pass 3 (the reductions below synchronize).
  if (threadIdx.x == 0) {
    if (stats.ce) stats.ce[row] = lse_z - to_float(z[y]);
    if (stats.lse_draft) stats.lse_draft[row] = lse_z;
    if (stats.lse_teacher) stats.lse_teacher[row] = lse_t;
    if (stats.argmax) stats.argmax[row] = best_index == kNoIndex ? -1 : best_index;
  }
  if (int(threadIdx.x) < top_k) {  // warp 0 holds the row's list
    const int64_t index = top.index(), slot = row * top_k + threadIdx.x;
    if (stats.top_indices) stats.top_indices[slot] = index;
    if constexpr (kTeacher) {
      if (stats.top_teacher_probs) stats.top_teacher_probs[slot] = expf(to_float(t[index]) - lse_t);
    }
  }
  if constexpr (!kTeacher) return;

  // Pass 2: l1 = Σ|p − q| and S = Σ p·sign(p − q).
  float l1 = 0.f, signed_mass = 0.f;
  for_each_pack<T, N, kTeacher>(z, t, rows.vocab, [&](int64_t, const auto& zp, const auto& tp) {
    constexpr int n = pack_size<decltype(zp)>;
#pragma unroll
    for (int e = 0; e < n; ++e) {
      const float p = __expf(to_float(zp.v[e]) - lse_z);
      const float d = p - __expf(to_float(tp.v[e]) - lse_t);
      l1 += fabsf(d);
      signed_mass += p * sign_of(d);
    }
  });
  l1 = detail::block_sum(l1, scratch_a);
  signed_mass = detail::block_sum(signed_mass, scratch_a);
  if (threadIdx.x == 0 && stats.l1) stats.l1[row] = l1;
  if constexpr (!kGradient) return;

  // Pass 3: the gradient over z, in place.
  const float w = gradient.weights[row];
  if (w == 0.f) {
    for (int64_t i = threadIdx.x; i < rows.vocab; i += kThreads) z[i] = detail::from_float<T>(0.f);
    return;
  }
  const float a_ce = w * gradient.ce_weight, a_l1 = w * gradient.l1_weight;
  for_each_pack<T, N, kTeacher>(z, t, rows.vocab, [&](int64_t i, const auto& zp, const auto& tp) {
    constexpr int n = pack_size<decltype(zp)>;
    float g[n];
#pragma unroll
    for (int e = 0; e < n; ++e) {
      const float p = __expf(to_float(zp.v[e]) - lse_z);
      const float s = sign_of(p - __expf(to_float(tp.v[e]) - lse_t));
      g[e] = a_ce * (p - static_cast<float>(i + e == y)) + a_l1 * p * (s - signed_mass);
    }
    store_pack<T, n>(z + i, pack_from_floats<T, n>(g));
  });
}

// The teacher form with a cluster of blocks per row (blockIdx.x / cluster size = row). Block r of
// the cluster takes packs [r·slice_packs, (r + 1)·slice_packs) of the row (the last one also the
// scalar tail) and keeps them, z and t, in its dynamic shared memory: pass 1 reads them from
// global memory once, passes 2 and 3 from shared memory; statistics, top-k and sums are folded
// over the cluster in rank order, and block 0 writes the row's outputs.
template <typename T, int N, bool kGradient>
__global__ void __launch_bounds__(kClusterThreads, 1)
    vocab_rows_cluster_kernel(VocabRows rows, VocabRowStats stats, VocabGradient gradient,
                              int64_t slice_packs) {
  extern __shared__ __align__(16) unsigned char slice_memory[];
  __shared__ float scratch_a[kClusterWarps], scratch_b[kClusterWarps];
  __shared__ int64_t scratch_index[kClusterWarps];
  __shared__ uint64_t top_lists[kClusterWarps * detail::kWarpLanes];
  __shared__ uint64_t cluster_list[detail::kWarpLanes];
  __shared__ float slot_a, slot_b;
  __shared__ int64_t slot_index;
  auto cluster = cooperative_groups::this_cluster();
  const int64_t rank = cluster.block_rank(), blocks = cluster.num_blocks();
  const int64_t row = blockIdx.x / blocks;
  const int64_t packs = rows.vocab / N;
  const int64_t begin = min(packs, rank * slice_packs) * N;
  const int64_t length =
      (rank + 1 == blocks ? rows.vocab : min(packs, (rank + 1) * slice_packs) * N) - begin;
  T* z_row = static_cast<T*>(rows.draft) + row * rows.row_stride;
  const T* t_row = static_cast<const T*>(rows.teacher) + row * rows.row_stride;
  T* z = z_row + begin;
  const T* t = t_row + begin;
  T* z_kept = reinterpret_cast<T*>(slice_memory);
  T* t_kept = z_kept + (slice_packs + 1) * N;  // room for the tail, 16-byte aligned
  const int64_t y = rows.labels[row];

  // Pass 1 (global memory): statistics, argmax and top-k of the slice, kept in shared memory.
  float mz = -INFINITY, sz = 0.f, mt = -INFINITY, st = 0.f, best = -INFINITY;
  int64_t best_index = kNoIndex;
  const int top_k = stats.top_k;
  detail::WarpTopK top(top_k);
  auto statistics = [&](int64_t i, const auto& zp, const auto& tp) {
    constexpr int n = pack_size<decltype(zp)>;
    float zv[n], tv[n];
#pragma unroll
    for (int e = 0; e < n; ++e) {
      zv[e] = to_float(zp.v[e]);
      tv[e] = to_float(tp.v[e]);
    }
    if (top_k == 0) {  // else the argmax is the first candidate
#pragma unroll
      for (int e = 0; e < n; ++e) merge_argmax(best, best_index, zv[e], begin + i + e);
    }
    add_values(mz, sz, zv);
    add_values(mt, st, tv);
    store_pack(z_kept + i, zp);
    store_pack(t_kept + i, tp);
  };
  auto select = [&](int64_t i, const auto& zp, bool valid) {
    if (top_k == 0) return;
    constexpr int n = pack_size<decltype(zp)>;
    float zv[n];
#pragma unroll
    for (int e = 0; e < n; ++e) zv[e] = to_float(zp.v[e]);
    top.offer(zv, begin + i, valid);
  };
  for_each_pack<T, N, true, kClusterThreads>(z, t, length, statistics, select);
  block_stats(mz, sz, scratch_a, scratch_b);
  cluster_fold(mz, sz, -INFINITY, 0.f, &slot_a, &slot_b, StatsMerge{});
  block_stats(mt, st, scratch_a, scratch_b);
  cluster_fold(mt, st, -INFINITY, 0.f, &slot_a, &slot_b, StatsMerge{});
  if (top_k > 0) {
    top.merge_block(top_lists);
    top.merge_cluster(cluster, cluster_list);
    best_index = top.index();  // thread 0 holds the first candidate
  } else {
    block_argmax(best, best_index, scratch_a, scratch_index);
    cluster_fold(best, best_index, -INFINITY, kNoIndex, &slot_a, &slot_index, ArgmaxMerge{});
  }
  const float lse_z = log_sum_exp(mz, sz);
  const float lse_t = log_sum_exp(mt, st);
  // z_y is read before the block holding it reaches pass 3 (behind pass 2's cluster fold).
  if (rank == 0 && threadIdx.x == 0) {
    if (stats.ce) stats.ce[row] = lse_z - to_float(z_row[y]);
    if (stats.lse_draft) stats.lse_draft[row] = lse_z;
    if (stats.lse_teacher) stats.lse_teacher[row] = lse_t;
    if (stats.argmax) stats.argmax[row] = best_index == kNoIndex ? -1 : best_index;
  }
  if (rank == 0 && int(threadIdx.x) < top_k) {  // warp 0 holds the row's list
    const int64_t index = top.index(), slot = row * top_k + threadIdx.x;
    if (stats.top_indices) stats.top_indices[slot] = index;
    if (stats.top_teacher_probs) stats.top_teacher_probs[slot] = expf(to_float(t_row[index]) - lse_t);
  }

  // Pass 2 (shared memory): l1 = Σ|p − q| and S = Σ p·sign(p − q).
  float l1 = 0.f, signed_mass = 0.f;
  for_each_pack<T, N, true, kClusterThreads>(
      z_kept, t_kept, length, [&](int64_t, const auto& zp, const auto& tp) {
        constexpr int n = pack_size<decltype(zp)>;
#pragma unroll
        for (int e = 0; e < n; ++e) {
          const float p = __expf(to_float(zp.v[e]) - lse_z);
          const float d = p - __expf(to_float(tp.v[e]) - lse_t);
          l1 += fabsf(d);
          signed_mass += p * sign_of(d);
        }
      });
  l1 = detail::block_sum(l1, scratch_a);
  signed_mass = detail::block_sum(signed_mass, scratch_a);
  cluster_fold(l1, signed_mass, 0.f, 0.f, &slot_a, &slot_b, SumsMerge{});
  if (rank == 0 && threadIdx.x == 0 && stats.l1) stats.l1[row] = l1;
  if constexpr (!kGradient) return;

  // Pass 3 (shared memory in, global memory out): the gradient over the slice of z.
  const float w = gradient.weights[row];
  if (w == 0.f) {
    for (int64_t i = threadIdx.x; i < length; i += kClusterThreads) z[i] = detail::from_float<T>(0.f);
    return;
  }
  const float a_ce = w * gradient.ce_weight, a_l1 = w * gradient.l1_weight;
  for_each_pack<T, N, true, kClusterThreads>(
      z_kept, t_kept, length, [&](int64_t i, const auto& zp, const auto& tp) {
        constexpr int n = pack_size<decltype(zp)>;
        float g[n];
#pragma unroll
        for (int e = 0; e < n; ++e) {
          const float p = __expf(to_float(zp.v[e]) - lse_z);
          const float s = sign_of(p - __expf(to_float(tp.v[e]) - lse_t));
          g[e] = a_ce * (p - static_cast<float>(begin + i + e == y)) + a_l1 * p * (s - signed_mass);
        }
        store_pack<T, n>(z + i, pack_from_floats<T, n>(g));
      });
}

bool packs_aligned(const VocabRows& rows, int64_t element_bytes) {
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  return aligned(rows.draft) && (rows.teacher == nullptr || aligned(rows.teacher)) &&
         (rows.row_stride * element_bytes) % 16 == 0;
}

// Launches the cluster kernel over 16-byte packs of T: the fewest blocks per row whose slices
// fit in kSliceBytes. Returns false (nothing launched) when none do.
template <typename T, bool kGradient>
bool launch_cluster(const VocabRows& rows, const VocabRowStats& stats,
                    const VocabGradient& gradient, cudaStream_t stream, cudaError_t& error) {
  constexpr int N = 16 / sizeof(T);
  const int64_t packs = rows.vocab / N;
  for (int blocks = 1; blocks <= kMaxClusterBlocks; blocks *= 2) {
    const int64_t slice_packs = (packs + blocks - 1) / blocks;
    const int64_t bytes = 2 * (slice_packs + 1) * N * int64_t(sizeof(T));
    if (bytes > kSliceBytes) continue;
    if (rows.rows * blocks > INT32_MAX) return false;
    auto kernel = vocab_rows_cluster_kernel<T, N, kGradient>;
    error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    if (error != cudaSuccess) return true;
    cudaLaunchAttribute cluster_shape;
    cluster_shape.id = cudaLaunchAttributeClusterDimension;
    cluster_shape.val.clusterDim.x = blocks;
    cluster_shape.val.clusterDim.y = 1;
    cluster_shape.val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(rows.rows * blocks));
    config.blockDim = dim3(kClusterThreads);
    config.dynamicSmemBytes = static_cast<size_t>(bytes);
    config.stream = stream;
    config.attrs = &cluster_shape;
    config.numAttrs = 1;
    error = cudaLaunchKernelEx(&config, kernel, rows, stats, gradient, slice_packs);
    return true;
  }
  return false;
}

// Launches the kernel for the rows' element type, in 16-byte packs when every row start allows:
// the cluster form for the teacher form where a row's slices fit, else the streaming form.
template <bool kTeacher, bool kGradient>
cudaError_t launch(const VocabRows& rows, const VocabRowStats& stats,
                   const VocabGradient& gradient, cudaStream_t stream) {
  // Keys hold 32-bit indices; the top-k list is one entry per lane.
  if (stats.top_k < 0 || stats.top_k > kVocabMaxTopK || stats.top_k > rows.vocab ||
      (stats.top_k > 0 && rows.vocab > int64_t(UINT32_MAX))) {
    return cudaErrorInvalidValue;
  }
  if (rows.rows == 0) return cudaSuccess;
  if constexpr (kTeacher) {
    cudaError_t error = cudaSuccess;
    if (rows.rows_in_shared_memory && rows.type == DType::kBFloat16 && packs_aligned(rows, 2) &&
        launch_cluster<__nv_bfloat16, kGradient>(rows, stats, gradient, stream, error)) {
      return error;
    }
    if (rows.rows_in_shared_memory && rows.type == DType::kFloat32 && packs_aligned(rows, 4) &&
        launch_cluster<float, kGradient>(rows, stats, gradient, stream, error)) {
      return error;
    }
  }
  auto go = [&](auto kernel) {
    kernel<<<static_cast<unsigned>(rows.rows), kThreads, 0, stream>>>(rows, stats, gradient);
    return cudaGetLastError();
  };
  switch (rows.type) {
    case DType::kBFloat16:
      return packs_aligned(rows, 2) ? go(vocab_rows_kernel<__nv_bfloat16, 8, kTeacher, kGradient>)
                                    : go(vocab_rows_kernel<__nv_bfloat16, 1, kTeacher, kGradient>);
    case DType::kFloat32:
      return packs_aligned(rows, 4) ? go(vocab_rows_kernel<float, 4, kTeacher, kGradient>)
                                    : go(vocab_rows_kernel<float, 1, kTeacher, kGradient>);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t vocab_objective_rows(const VocabRows& rows, const VocabRowStats& stats,
                                 const VocabGradient* gradient, cudaStream_t stream) {
  if (rows.teacher == nullptr) return cudaErrorInvalidValue;
  return gradient != nullptr ? launch<true, true>(rows, stats, *gradient, stream)
                             : launch<true, false>(rows, stats, VocabGradient{}, stream);
}

cudaError_t vocab_ce_rows(const VocabRows& rows, const VocabRowStats& stats, cudaStream_t stream) {
  return launch<false, false>(rows, stats, VocabGradient{}, stream);
}

}  // namespace dspine::kernels
