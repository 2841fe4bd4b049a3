// Fused GSPO segment seam (docs/gspo.md, "The seam") on raw device pointers, in two forms:
// - local (no segment spans ranks): gspo_seam_local, two launches — a kernel zeroing the
//   workspace's head, then one cooperative kernel doing block 1, the deterministic segmented
//   reduction into the fp32 [2, S] buffer and block 2 (c_t, loss and metric sums);
// - spanning ranks: gspo_seam_reduce (the same two launches, stopping at the [2, S] buffer), the
//   caller's all-reduce (SUM) of that buffer — the first 2·S floats of the workspace — and
//   gspo_seam_finish (block 2, one launch).
// Every kernel after the first starts while the one before it runs (programmatic dependent
// launch) and waits for it before reading what it wrote.
//
// Packed segments are contiguous: the labelled tokens of one segment must form one run among
// the labelled tokens (masked tokens between them, whatever their id, are skipped). Each segment
// sum is then written by exactly one thread, in an order fixed by the token layout and the
// device's multiprocessor count, so results are bitwise reproducible and no float atomics are
// used. A segment found in two runs is reported through the status word (kGspoSplitSegment),
// never written out of bounds.
//
// Reduce also keeps, per token, a 4-byte key (segment id, −1 when masked; in shared memory when
// the local form's block ranges fit, in the workspace otherwise) and leaves, per segment, this
// rank's labelled count n_s and weight Σ w_t; block 2 reads only those (the key, besides the
// coefficient it writes) instead of the per-token inputs again.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace dspine::kernels {

enum class GspoIndexType { kInt32, kInt64 };
enum class GspoCountType { kInt32, kInt64, kFloat32 };

// Bits of the status word (an int in the workspace, cleared by reduce; the ops layer reads it
// when validating).
constexpr int kGspoBadSegment = 1;    // unmasked token whose segment id is outside [0, S)
constexpr int kGspoNonFinite = 2;     // non-finite logprob / old logprob / advantage / count
constexpr int kGspoSplitSegment = 4;  // a segment's labelled tokens are not one contiguous run
constexpr int kGspoBadTarget = 8;     // unmasked target outside [0, V) (vocab forward)

// Per-token inputs, each a contiguous array of `num_tokens` elements. mask_t = target_t >= 0.
struct GspoSeamTokens {
  const float* logprobs = nullptr;  // lp_t
  const int64_t* target = nullptr;
  const float* old_logprobs = nullptr;
  const float* advantages = nullptr;
  const void* segment = nullptr;
  GspoIndexType segment_type = GspoIndexType::kInt64;
  const void* label_counts = nullptr;  // N_t: labelled tokens of the token's whole segment
  GspoCountType count_type = GspoCountType::kInt64;
  int64_t num_tokens = 0;
  int64_t num_segments = 0;
};

// Block-2 scalars: the clip range [ratio_low, ratio_high] = [1−eps_low, 1+eps_high] (formed by
// the caller in double, as the reference does), `divisor` D and coefficient_scale = g/D·λ.
struct GspoSeamScalars {
  float ratio_low = 1.f;
  float ratio_high = 1.f;
  float divisor = 1.f;
  float coefficient_scale = 0.f;
};

// Bytes of device workspace for one seam call (4-byte aligned; first 2·S floats are the sums).
size_t gspo_seam_workspace_bytes(int64_t num_tokens, int64_t num_segments);
// Offset, in 4-byte words, of the int status word inside the workspace.
int64_t gspo_seam_status_offset(int64_t num_segments);

// The whole seam for a rank whose segments are all local: coefficient[t] = c_t (skipped when
// `coefficient` is null: forward only) and scalars_out[4] = {loss_sum, new_logprobs_sum,
// clipped_sum, ratio_sum} / D. clipped and ratio are weighted by w_t, so each labelled segment
// counts once. The sums are left in the workspace as gspo_seam_reduce leaves them.
cudaError_t gspo_seam_local(const GspoSeamTokens& tokens, const GspoSeamScalars& scalars,
                            void* workspace, float* coefficient, float* scalars_out,
                            cudaStream_t stream);

// Block 1 and the segmented reduction: sums[0][s] = U_s = Σ u_t, sums[1][s] = V_s = Σ v_t, plus
// the rank's Σ m_t·lp_t·w_t for the new_logprobs metric (kept in the workspace for finish).
cudaError_t gspo_seam_reduce(const GspoSeamTokens& tokens, void* workspace, cudaStream_t stream);

// Block 2 after the all-reduce: c_t as above and scalars_out[4], this rank's share.
cudaError_t gspo_seam_finish(const GspoSeamTokens& tokens, const GspoSeamScalars& scalars,
                             void* workspace, float* coefficient, float* scalars_out,
                             cudaStream_t stream);

}  // namespace dspine::kernels
