// The GSPO segment seam (docs/gspo.md, "The seam"): per-token weights, the per-segment sums (one
// all-reduce of the [2, S] buffer when segments span ranks), the loss, metrics and the per-token
// gradient coefficient c_t. Two back ends with one contract: the reference (ATen ops mirroring the
// spec op by op; CPU and CUDA; the oracle) and the fused CUDA kernels (3 launches, deterministic).
// The monolithic entry point adds the vocab level around the seam (log-softmax forward and the c·(p
// − δ) backward into the logits gradient) without storing any [N, V] fp32 tensor.
#pragma once

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>

#include "dist/communicator.h"

namespace dspine::ops {

// Per-token inputs on one flat token axis (flatten [B, T] batches first), each [N].
struct GspoTokens {
  at::Tensor target;        // int64 sampled token id; < 0 (e.g. −100) = masked
  at::Tensor old_logprobs;  // fp32 log-prob of target under the rollout policy
  at::Tensor advantages;    // fp32
  at::Tensor segment;       // int32/int64 global segment id; unmasked ids must be in [0, S)
  at::Tensor label_counts;  // int32/int64/fp32 labelled tokens N_s of the token's whole segment
};

struct GspoSeamParams {
  int64_t num_segments = 0;  // S
  double logits_scale = 1.0;  // λ
  double eps_low = 3e-4;
  double eps_high = 4e-4;
  double divisor = 1.0;  // D: segments in the global batch
  std::optional<double> grad_output;  // g; none = forward only (no coefficient, no gradient)
  bool segments_span_ranks = false;  // all-reduce the [2, S] sums over `comm`
  bool validate = true;  // value checks (bad ids, non-finite inputs); they synchronise the device
};

enum class GspoBackend {
  kAuto,       // fused on CUDA tensors, reference on CPU
  kReference,  // ATen ops (the oracle)
  kFused,      // CUDA kernels (ops/gspo_ops.h)
};

// Whether `backend` runs the fused kernels on tensors like `on`; kFused on a CPU tensor is an
// error.
bool gspo_fused_backend(GspoBackend backend, const at::Tensor& on);

// Scalars are 0-dim fp32 tensors holding this rank's share: summed over ranks they give the
// global value (loss = Σ_t m_t·ℓ_t / D). clipped_fraction and ratio_mean weight each token by
// w_t = m_t / max(N_t, 1), so every labelled segment counts once however it is split.
struct GspoSeamResult {
  at::Tensor loss;
  at::Tensor new_logprobs;
  at::Tensor clipped_fraction;
  at::Tensor ratio_mean;
  at::Tensor coefficient;   // [N] fp32 c_t = −λ·∂L/∂lp_t; undefined without grad_output
  at::Tensor segment_sums;  // [2, S] fp32 (U_s, V_s) after the cross-rank reduction
};

// The seam on given new log-probs `logprobs` ([N] fp32). Issues exactly one collective on
// `comm` when params.segments_span_ranks, none otherwise.
GspoSeamResult gspo_segment_seam(const at::Tensor& logprobs, const GspoTokens& tokens,
                                 const GspoSeamParams& params, dist::Communicator& comm,
                                 GspoBackend backend = GspoBackend::kAuto);

struct GspoVocabResult {
  GspoSeamResult seam;
  at::Tensor logprobs;  // [N] fp32 lp_t (0 at masked rows for the fused back end)
};

// Monolithic path: logits [N, V] (bf16/fp32) → lp_t → seam → (when grad_output is set and
// grad_logits is given) grad_logits = c_t·(p − δ), overwritten (masked rows 0) or accumulated
// (masked rows untouched). grad_logits has the logits' shape and dtype. The reference back end
// works in chunks of `chunk_rows` rows (0: about 256 MiB of fp32 per chunk).
GspoVocabResult gspo_vocab_seam(const at::Tensor& logits, const GspoTokens& tokens,
                                const GspoSeamParams& params, dist::Communicator& comm,
                                at::Tensor* grad_logits, bool accumulate,
                                GspoBackend backend = GspoBackend::kAuto,
                                int64_t chunk_rows = 0);

// Throws dspine::Error naming the offending tensor for inconsistent inputs: missing tensors,
// mismatched lengths, wrong dtypes, mixed devices, num_segments < 1 or divisor <= 0. Host-only.
void validate_seam_shapes(const at::Tensor& logprobs, const GspoTokens& tokens,
                          const GspoSeamParams& params);

// Throws for labelled tokens with a segment id outside [0, S) or non-finite logprobs,
// old_logprobs, advantages or label_counts (values at masked positions are ignored); names
// the first offending token. Synchronises the device.
void validate_seam_values(const at::Tensor& logprobs, const GspoTokens& tokens,
                          const GspoSeamParams& params);

}  // namespace dspine::ops
