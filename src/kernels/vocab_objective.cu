// Fused vocabulary objective row kernels: see vocab_objective.h. Memory-bound streaming, one block
// per row: each pass reads the row's z (and t) in 16-byte packs through a per-thread ring of
// asynchronous copies into shared memory, kStages packs of each in flight per thread, and folds a
// pack into the running statistics with one rescale (its own maximum first). Block reductions run
// in a fixed order, so results are deterministic.
#include "kernels/vocab_objective.h"

#include <cuda_bf16.h>

#include <cmath>
#include <type_traits>

#include "kernels/async_copy.cuh"
#include "kernels/norm_swiglu_common.cuh"
#include "kernels/vocab_topk.cuh"

namespace dspine::kernels {
namespace {

using detail::commit_async;
using detail::copy16_async;
using detail::load_pack;
using detail::Pack;
using detail::pack_from_floats;
using detail::store_pack;
using detail::to_float;
using detail::wait_async;

// A block of 128 threads with 8 packs of z and t in flight per thread (a 32 KB ring), six blocks
// per SM: measured fastest on an H200 among 128–512 threads, 4–16 stages (docs/kernels.md).
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kStages = 8;
constexpr int kBlocksPerSm = 6;
static_assert(kThreads * kStages * 16 * 2 <= 48 * 1024, "the ring fits the default shared memory");
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
// 16-byte packs arrive through `ring`, kStages slots per thread (and per tensor) in shared memory
// filled by asynchronous copies kStages packs ahead, so the loads in flight take no registers;
// each thread reads only the slots it filled, so no barrier is needed.
template <typename T, int N, bool kTeacher, typename F, typename Step = NoStep>
__device__ __forceinline__ void for_each_pack(const T* z, const T* t, int64_t vocab, uint4* ring,
                                              F&& f, Step&& step = {}) {
  static_assert(pack_size<const Pack<T, N>&> == N && pack_size<Pack<T, 1>> == 1);
  const int64_t packs = vocab / N;
  const int lane = threadIdx.x % 32;
  if constexpr (sizeof(Pack<T, N>) == 16) {
    uint4* z_ring = ring;
    uint4* t_ring = ring + kStages * kThreads;
    auto fetch = [&](int64_t i) {  // iteration i's pack into its slot, as one commit group
      const int64_t v = threadIdx.x + i * kThreads;
      const int slot = int(i % kStages) * kThreads + threadIdx.x;
      if (v < packs) {
        copy16_async(z_ring + slot, z + v * N);
        if constexpr (kTeacher) copy16_async(t_ring + slot, t + v * N);
      }
      commit_async();
    };
    const int64_t iterations = (packs + kThreads - 1) / kThreads;  // the same for every thread
#pragma unroll
    for (int i = 0; i < kStages; ++i) fetch(i);
    for (int64_t i = 0; i < iterations; ++i) {
      wait_async<kStages - 1>();
      const int slot = int(i % kStages) * kThreads + threadIdx.x;
      Pack<T, N> zp, tp;
      const uint4 z_raw = z_ring[slot];
      memcpy(&zp, &z_raw, 16);
      if constexpr (kTeacher) {
        const uint4 t_raw = t_ring[slot];
        memcpy(&tp, &t_raw, 16);
      } else {
        tp = zp;
      }
      const int64_t v = threadIdx.x + i * kThreads;
      if (v < packs) f(v * N, zp, tp);
      step(v * N, zp, v < packs);
      fetch(i + kStages);  // the slot's values are in registers and used above
    }
    wait_async<0>();  // the ring is refilled by the next pass
  } else {
    // The loop conditions test the warp's first lane, so that every lane takes each step.
    constexpr int kUnroll = 4;
    for (int64_t j = threadIdx.x; j - lane < packs; j += int64_t(kThreads) * kUnroll) {
      Pack<T, N> zp[kUnroll], tp[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t v = j + int64_t(u) * kThreads;
        if (v < packs) {
          zp[u] = load_pack<T, N>(z + v * N);
          tp[u] = kTeacher ? load_pack<T, N>(t + v * N) : zp[u];
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t v = j + int64_t(u) * kThreads;
        if (v < packs) f(v * N, zp[u], tp[u]);
        step(v * N, zp[u], v < packs);
      }
    }
  }
  for (int64_t i = packs * N + threadIdx.x; i - lane < vocab; i += kThreads) {
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
  for (int w = 0; w < kWarps; ++w) merge(a, b, sa[w], sb[w]);
  __syncthreads();  // the scratch is reused
}

__device__ __forceinline__ void block_stats(float& m, float& s, float* sm, float* ss) {
  block_fold(m, s, -INFINITY, 0.f, sm, ss,
             [](float& m1, float& s1, float m2, float s2) { merge_stats(m1, s1, m2, s2); });
}

__device__ __forceinline__ void block_argmax(float& v, int64_t& i, float* sv, int64_t* si) {
  block_fold(v, i, -INFINITY, kNoIndex, sv, si,
             [](float& v1, int64_t& i1, float v2, int64_t i2) { merge_argmax(v1, i1, v2, i2); });
}

// log(Σ exp) from (m, s), the logarithm in double: it is taken once per row.
__device__ __forceinline__ float log_sum_exp(float m, float s) {
  return static_cast<float>(double(m) + log(double(s)));
}

__device__ __forceinline__ float sign_of(float d) {
  return static_cast<float>((d > 0.f) - (d < 0.f));
}

template <typename T, int N, bool kTeacher, bool kGradient>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    vocab_rows_kernel(VocabRows rows, VocabRowStats stats, VocabGradient gradient) {
  extern __shared__ uint4 ring[];  // for_each_pack's slots
  __shared__ float scratch_a[kWarps], scratch_b[kWarps];
  __shared__ int64_t scratch_index[kWarps];
  __shared__ uint64_t top_lists[kWarps * detail::kWarpLanes];
  const int64_t row = blockIdx.x;
  T* z = static_cast<T*>(rows.draft) + row * rows.row_stride;
  const int64_t teacher_row = rows.teacher_rows != nullptr ? rows.teacher_rows[row] : row;
  const T* t =
      kTeacher ? static_cast<const T*>(rows.teacher) + teacher_row * rows.row_stride : nullptr;
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
  for_each_pack<T, N, kTeacher>(z, t, rows.vocab, ring, statistics, select);
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
  for_each_pack<T, N, kTeacher>(z, t, rows.vocab, ring, [&](int64_t, const auto& zp,
                                                             const auto& tp) {
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

  // Pass 3: the gradient over z, in place. The row's sampled tokens and their coefficients are
  // shared by the block; coefficients may cancel in C_r, so a row is all zero only when every
  // part of its gradient is.
  __shared__ int64_t sampled[kVocabMaxPolicyGroup];
  __shared__ float sampled_coefficient[kVocabMaxPolicyGroup];
  const int group = gradient.policy_total != nullptr ? gradient.policy_group : 0;
  if (int(threadIdx.x) < group) {
    const int64_t slot = row * gradient.policy_group + threadIdx.x;
    sampled[threadIdx.x] = gradient.policy_targets[slot];
    sampled_coefficient[threadIdx.x] = gradient.policy_coefficients[slot];
  }
  __syncthreads();
  bool sparse = false;  // a sampled column with a coefficient
  for (int k = 0; k < group; ++k) {
    sparse = sparse || (sampled[k] >= 0 && sampled_coefficient[k] != 0.f);
  }
  const int hits = sparse ? group : 0;
  const float w = gradient.weights[row];
  const float a_policy = group > 0 ? gradient.policy_total[row] : 0.f;
  if (w == 0.f && a_policy == 0.f && !sparse) {
    for (int64_t i = threadIdx.x; i < rows.vocab; i += kThreads) z[i] = detail::from_float<T>(0.f);
    return;
  }
  const float a_ce = w * gradient.ce_weight, a_l1 = w * gradient.l1_weight;
  for_each_pack<T, N, kTeacher>(z, t, rows.vocab, ring, [&](int64_t i, const auto& zp,
                                                             const auto& tp) {
    constexpr int n = pack_size<decltype(zp)>;
    float g[n];
#pragma unroll
    for (int e = 0; e < n; ++e) {
      const float p = __expf(to_float(zp.v[e]) - lse_z);
      const float s = sign_of(p - __expf(to_float(tp.v[e]) - lse_t));
      g[e] = a_ce * (p - static_cast<float>(i + e == y)) + a_l1 * p * (s - signed_mass) +
             a_policy * p;
    }
    for (int k = 0; k < hits; ++k) {
      // One unsigned compare tells whether sample k lands in this pack (masked ids are < 0).
      if (static_cast<uint64_t>(sampled[k] - i) >= static_cast<uint64_t>(n)) continue;
#pragma unroll
      for (int e = 0; e < n; ++e) {
        if (sampled[k] == i + e) g[e] -= sampled_coefficient[k];
      }
    }
    store_pack<T, n>(z + i, pack_from_floats<T, n>(g));
  });
}

bool packs_aligned(const VocabRows& rows, int64_t element_bytes) {
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  return aligned(rows.draft) && (rows.teacher == nullptr || aligned(rows.teacher)) &&
         (rows.row_stride * element_bytes) % 16 == 0;
}

// Launches the kernel for the rows' element type, in 16-byte packs when every row start allows.
template <bool kTeacher, bool kGradient>
cudaError_t launch(const VocabRows& rows, const VocabRowStats& stats,
                   const VocabGradient& gradient, cudaStream_t stream) {
  // Keys hold 32-bit indices; the top-k list is one entry per lane.
  if (stats.top_k < 0 || stats.top_k > kVocabMaxTopK || stats.top_k > rows.vocab ||
      (stats.top_k > 0 && rows.vocab > int64_t(UINT32_MAX))) {
    return cudaErrorInvalidValue;
  }
  if (gradient.policy_total != nullptr &&
      (gradient.policy_group < 1 || gradient.policy_group > kVocabMaxPolicyGroup ||
       gradient.policy_targets == nullptr || gradient.policy_coefficients == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (rows.rows == 0) return cudaSuccess;
  // The ring: kStages 16-byte slots per thread for z, and as many for t in the teacher form (the
  // scalar kernels for unaligned rows load directly and take none).
  auto go = [&](auto kernel, bool packed) {
    const int ring_bytes = packed ? kThreads * kStages * 16 * (kTeacher ? 2 : 1) : 0;
    kernel<<<static_cast<unsigned>(rows.rows), kThreads, ring_bytes, stream>>>(rows, stats,
                                                                              gradient);
    return cudaGetLastError();
  };
  switch (rows.type) {
    case DType::kBFloat16:
      return packs_aligned(rows, 2)
                 ? go(vocab_rows_kernel<__nv_bfloat16, 8, kTeacher, kGradient>, true)
                 : go(vocab_rows_kernel<__nv_bfloat16, 1, kTeacher, kGradient>, false);
    case DType::kFloat32:
      return packs_aligned(rows, 4) ? go(vocab_rows_kernel<float, 4, kTeacher, kGradient>, true)
                                    : go(vocab_rows_kernel<float, 1, kTeacher, kGradient>, false);
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
