// The GSPO policy term inside the fused vocabulary row pass (docs/gspo.md, "The policy term in
// the row pass"). The sampled blocks' log-probabilities, the seam and the policy's logits
// gradient are computed per row chunk from the chunk's draft logits z, which the supervised terms
// project anyway; nothing [rows, V] outlives a chunk and the policy adds no vocabulary GEMM.
// This works because a chunk holds whole blocks: every GSPO segment (one sampled block) lies in
// one chunk, and the seam's only global input, the divisor D, is known from the rollout.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "ops/gspo_seam.h"

namespace dspine::ops {

// The sampled blocks of M anchor blocks of T proposals, G samples per block. Row m·T + t of the
// hidden states is slot t of block m; every sample of a block reads the block's rows.
struct VocabPolicy {
  at::Tensor targets;       // [M, G, T] int64 token ids; < 0 = masked (a slot is masked in every
                            // sample of its block or in none)
  at::Tensor old_logprobs;  // [M, G, T] fp32 under the rollout's policy
  at::Tensor advantages;    // [M, G] fp32
  at::Tensor label_counts;  // [M] int64 unmasked slots of the block (N_s of its segments)
  double logits_scale = 1.0;  // λ: the policy is softmax(λ·z)
  double eps_low = 3e-4;
  double eps_high = 4e-4;
  double divisor = 1.0;       // D: segments of the whole window over all ranks
  // ρ: the op's loss holds ρ·(policy loss) beside the supervised terms, and its gradient alike,
  // so that one dX GEMM serves both (the caller scales the sum back).
  double loss_scale = 1.0;
  GspoBackend backend = GspoBackend::kAuto;  // the seam's and the row statistics' back end
};

// This rank's shares (0-dim fp32, detached): summed over ranks they are the window's values.
struct VocabPolicyResult {
  at::Tensor logprobs;  // [M, G, T] fp32 new log-probs (0 where masked)
  at::Tensor loss, new_logprobs, clipped_fraction, ratio_mean;
};

// Checks the policy's shapes against `rows` hidden rows and `vocab`; errors name the tensor.
void check_vocab_policy(const VocabPolicy& policy, int64_t rows, int64_t vocab);

// Blocks whose rows fit in `chunk_rows` (at least one block): the policy's chunk size.
int64_t policy_chunk_rows(int64_t chunk_rows, int64_t block_size);

// Accumulates the policy over the row chunks of one pass.
class VocabPolicyChunks {
 public:
  explicit VocabPolicyChunks(const VocabPolicy& policy);

  // z [c·T, V]: the logits of blocks [first_block, first_block + c). Computes their log-probs and
  // the seam; with `grad` defined (z's shape and dtype; it may be z itself), writes
  // ρ·Σ_g c_g·(p − δ_{y_g}) into it (masked rows 0). Issues no collective.
  void chunk(const at::Tensor& z, int64_t first_block, const at::Tensor& grad);

  // As chunk, but instead of writing the gradient, returns what a row pass at logits scale 1
  // folds into its own (VocabRowGradient's policy fields): per row of z the sampled tokens and
  // their coefficients ρ·c_g, [c·T, G] (0 where masked), and their sum C_r.
  struct RowCoefficients {
    at::Tensor targets, coefficients, total;
  };
  RowCoefficients chunk_coefficients(const at::Tensor& z, int64_t first_block);
  // Whether a row pass over softmax(z) may fold the gradient in: the policy's logits scale is 1.
  bool folds_into_row_pass() const { return policy_.logits_scale == 1.0; }
  // The loss share so far, ρ·Σ ℓ / D (0-dim fp32).
  at::Tensor scaled_loss() const;
  VocabPolicyResult result() const { return result_; }

 private:
  // One chunk's log-probs and seam, accumulated; the rows' targets, log-sum-exp, log-probs and
  // (with `gradient`) coefficients, [c·T, G] each but lse [c·T].
  struct ChunkRows {
    at::Tensor targets, lse, logprobs, coefficients;
  };
  ChunkRows seam_chunk(const at::Tensor& z, int64_t first_block, bool gradient);

  const VocabPolicy& policy_;
  int64_t group_, slots_;
  VocabPolicyResult result_;
};

// grad = Σ_g c_g·(p − δ_{y_g}) per row of z [n, V] (p = softmax(λ·z)), in z's dtype, with
// targets, coefficient and logprobs [n, G] and lse [n] (fp32): C·(p − δ_{y_0}) by the GSPO vocab
// backward kernel (fused) or chunked ATen, then each sampled column set to its exact value
// C·p_y − Σ_{g: y_g = y} c_g, computed in fp32 and rounded once. Rows with y_0 < 0 are 0. `grad`
// may be z itself.
void write_policy_gradient(const at::Tensor& z, const at::Tensor& targets, const at::Tensor& lse,
                           const at::Tensor& coefficient, const at::Tensor& logprobs,
                           double logits_scale, bool fused, const at::Tensor& grad);

// lse_r = logsumexp(λ·z_r) in fp32, by the GSPO vocab forward kernel (fused; rows with
// first_targets < 0 get 0) or in row chunks of ATen.
at::Tensor policy_row_logsumexp(const at::Tensor& z, const at::Tensor& first_targets,
                                double logits_scale, bool fused);

}  // namespace dspine::ops
