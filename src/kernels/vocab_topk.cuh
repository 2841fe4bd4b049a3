// Warp-cooperative top-k selection for the vocabulary row kernel (vocab_objective.cu): the k
// largest values of a row with their indices, in the order of a stable descending sort (larger
// value first, equal values by lower index). NaN ranks above +inf (as torch.topk), -0 equals +0.
//
// Each warp keeps its running top-k spread over its lanes (lane j holds the j-th best as one
// 64-bit key). While streaming, a lane tests each value against the warp's current k-th value —
// one compare per element — and only the rare values that pass are inserted by the whole warp: one
// at a time when few lanes have one, else a lane's best each by a bitonic merge (the first values
// of a row all pass). The warps' lists are then merged in shared memory by warp 0.
#pragma once

#include <cstdint>

namespace dspine::kernels::detail {

constexpr int kWarpLanes = 32;  // one list entry per lane: k <= 32
constexpr unsigned kFullWarp = 0xffffffffu;

// A key whose unsigned order is the selection order: the value's order-preserving bits above the
// complemented index. Key 0 lies below every element's key: the empty slot.
__device__ __forceinline__ uint64_t topk_key(float v, int64_t index) {
  uint32_t bits = v == 0.f ? 0u : __float_as_uint(v);  // -0 ranks as +0
  bits = isnan(v) ? 0xffffffffu : (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
  return (uint64_t(bits) << 32) | uint32_t(~uint32_t(index));
}

// The value of a key, NaN for NaN and for the empty slot (so that every value passes the filter
// while the list is not full).
__device__ __forceinline__ float topk_value(uint64_t key) {
  const uint32_t bits = uint32_t(key >> 32);
  return __uint_as_float((bits & 0x80000000u) ? bits & 0x7fffffffu : ~bits);
}

__device__ __forceinline__ int64_t topk_index(uint64_t key) { return ~uint32_t(key); }

class WarpTopK {
 public:
  __device__ explicit WarpTopK(int k) : k_(k), lane_(threadIdx.x % 32) {
    threshold_ = topk_value(kth_);  // NaN for the empty slot: every value passes until full
  }

  // Offers n consecutive values starting at element `first` (all lanes of the warp call this,
  // `valid` false where a lane has nothing). Within a warp, calls must come in increasing index
  // order (lane order within a call): a value equal to the k-th on entry is then never better.
  template <int n>
  __device__ __forceinline__ void offer(const float (&v)[n], int64_t first, bool valid) {
    unsigned pending = 0;
    if (valid) {
#pragma unroll
      for (int e = 0; e < n; ++e) pending |= unsigned(!(v[e] <= threshold_)) << e;  // NaN passes
    }
    for (unsigned lanes; (lanes = __ballot_sync(kFullWarp, pending != 0)) != 0;) {
      if (__popc(lanes) > kSerialLanes) {
        insert_all(take_best(v, first, pending));
        // Only values below the new k-th can go: an equal one may have a lower index.
#pragma unroll
        for (int e = 0; e < n; ++e)
          if (v[e] < threshold_) pending &= ~(1u << e);
        continue;
      }
      const int source = __ffs(lanes) - 1;
      uint64_t candidate = 0;
      if (lane_ == source) candidate = take_best(v, first, pending);
      insert_one(__shfl_sync(kFullWarp, candidate, source));
    }
  }

  // Merges every warp's list into warp 0's; `lists` holds kWarpLanes keys per warp of the block.
  // All threads call this; afterwards warp 0 holds the block's top-k.
  __device__ void merge_block(uint64_t* lists) {
    const int warp = threadIdx.x / 32;
    lists[warp * kWarpLanes + lane_] = key_;
    __syncthreads();
    if (warp == 0) {
      for (int w = 1; w < int(blockDim.x / 32); ++w) insert_all(lists[w * kWarpLanes + lane_]);
    }
    __syncthreads();  // the lists may be reused
  }

  // This lane's entry (lane j < k: the j-th best), for warp 0 after merge_block.
  __device__ int64_t index() const { return topk_index(key_); }

 private:
  // Below this many lanes with candidates, inserting them one by one is cheaper than insert_all.
  static constexpr int kSerialLanes = 4;

  // The key of this lane's best pending value (0 if none), taken off `pending`.
  template <int n>
  __device__ __forceinline__ static uint64_t take_best(const float (&v)[n], int64_t first,
                                                       unsigned& pending) {
    uint64_t best = 0;
    int chosen = 0;
#pragma unroll
    for (int e = 0; e < n; ++e) {
      const uint64_t key = topk_key(v[e], first + e);
      if (((pending >> e) & 1u) && key > best) {
        best = key;
        chosen = e;
      }
    }
    if (best != 0) pending &= ~(1u << chosen);
    return best;
  }

  __device__ __forceinline__ void set_kth() {
    if (lane_ >= k_) key_ = 0;  // only the first k lanes are the list
    kth_ = __shfl_sync(kFullWarp, key_, k_ - 1);
    threshold_ = topk_value(kth_);
  }

  // Inserts a key given to every lane, if it beats the k-th.
  __device__ __forceinline__ void insert_one(uint64_t candidate) {
    if (candidate <= kth_) return;
    const int position = __popc(__ballot_sync(kFullWarp, key_ > candidate));
    const uint64_t above = __shfl_up_sync(kFullWarp, key_, 1);
    if (lane_ > position) key_ = above;
    if (lane_ == position) key_ = candidate;
    set_kth();
  }

  // Inserts one key per lane (0: none) at once: a bitonic sort of the candidates, descending,
  // then the top 32 of list ∪ candidates as the elementwise maximum of the list and the reversed
  // candidates (a bitonic sequence), sorted by one bitonic merge.
  __device__ __forceinline__ void insert_all(uint64_t candidate) {
#pragma unroll
    for (int size = 2; size <= 32; size *= 2) {
#pragma unroll
      for (int stride = size / 2; stride > 0; stride /= 2) {
        const uint64_t other = __shfl_xor_sync(kFullWarp, candidate, stride);
        const bool keep_max = ((lane_ & stride) == 0) == ((lane_ & size) == 0);  // descending runs
        candidate = keep_max ? max(candidate, other) : min(candidate, other);
      }
    }
    key_ = max(key_, __shfl_sync(kFullWarp, candidate, 31 - lane_));
#pragma unroll
    for (int stride = 16; stride > 0; stride /= 2) {
      const uint64_t other = __shfl_xor_sync(kFullWarp, key_, stride);
      key_ = (lane_ & stride) == 0 ? max(key_, other) : min(key_, other);
    }
    set_kth();
  }

  int k_;
  int lane_;
  uint64_t key_ = 0;  // empty
  uint64_t kth_ = 0;
  float threshold_;  // kth_'s value
};

}  // namespace dspine::kernels::detail
