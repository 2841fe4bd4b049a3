// The rollout of a GSPO RL step (docs/gspo.md, "RL steps"): the draft is the policy and one
// sampled draft block is one segment. For every kept anchor block it draws G blocks of T tokens,
// records their log-probabilities under the policy, scores each against the target's tokens and
// turns the scores into group advantages. Everything here runs without gradients. The scores come
// from a BlockVerifier: by default the target itself (block_verifier.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "core/settings.h"
#include "data/batch.h"
#include "model/dspine_draft.h"
#include "objectives/block_verifier.h"
#include "objectives/dspine_forward.h"
#include "objectives/row_streams.h"

namespace dspine::objectives {

// How a block is drawn: every slot independently from the backbone distribution, or
// semi-autoregressively through the refinement head over the backbone's top-k candidates, with
// the previous sampled token as predecessor (the walk used at inference).
enum class GspoSampling { kBackbone, kRefinement };
enum class GspoReward { kGreedyMatch, kExpectedAcceptance };
enum class GspoAdvantageNorm { kGroupStd, kGroupMean };
constexpr std::array<core::Choice<GspoSampling>, 2> choices_of(GspoSampling) {
  return {{{GspoSampling::kBackbone, "backbone"}, {GspoSampling::kRefinement, "refinement"}}};
}
constexpr std::array<core::Choice<GspoReward>, 2> choices_of(GspoReward) {
  return {{{GspoReward::kGreedyMatch, "greedy_match"},
           {GspoReward::kExpectedAcceptance, "expected_acceptance"}}};
}
constexpr std::array<core::Choice<GspoAdvantageNorm>, 2> choices_of(GspoAdvantageNorm) {
  return {
      {{GspoAdvantageNorm::kGroupStd, "group_std"}, {GspoAdvantageNorm::kGroupMean, "group_mean"}}};
}

struct GspoRolloutSettings {
  int64_t group_size = 4;     // G blocks per kept anchor
  double temperature = 1.0;   // τ of the sampling distribution softmax(λ·z/τ)
  double logits_scale = 1.0;  // λ: the policy is softmax(λ·z)
  GspoSampling sampling = GspoSampling::kBackbone;
  GspoReward reward = GspoReward::kGreedyMatch;
  GspoAdvantageNorm advantage_norm = GspoAdvantageNorm::kGroupStd;
  int64_t top_k = 16;          // refinement candidates (model.dspine.top_k)
  int64_t chunk_blocks = 128;  // kept blocks per vocabulary chunk; 0 = all at once
  // Backbone draws by the fused row kernel (ops/logit_rows_ops.h) instead of fp32 softmaxes of
  // whole rows: on where the model's vocabulary terms are fused (CUDA, model.fused_kernels).
  bool fused_sampling = false;
};

// GspoRollout::draw_check: what the rollout's device-side check of its drawn ids found, in fp64.
enum DrawCheck : int64_t {
  kDrawsOutside,       // ids outside [0, V): a sampler fault
  kFirstOutside,       // the first one's flat index in tokens [K, G, T]
  kFirstOutsideValue,  // its value
  kDrawsUndrawn,       // draws from rows with nothing to draw from (NaN or +inf logits)
  kFirstUndrawn,       // the first one's flat index
  kDrawCheckSize
};

// One micro-batch's rollout over its K kept blocks.
struct GspoRollout {
  at::Tensor anchors, keep;  // [B, N] the sampled anchor blocks (the update replays them)
  at::Tensor kept;           // [K] int64 indices of the kept blocks among the M = B·N rows
  at::Tensor tokens;         // [K, G, T] int64 sampled token ids
  // Index of each sampled token in its policy row: the token id (backbone) or the position among
  // the slot's candidates (refinement).
  at::Tensor choices;        // [K, G, T] int64
  at::Tensor candidates;     // [K, T, k] int64 candidate token ids (refinement only)
  at::Tensor old_logprobs;   // [K, G, T] fp32 log-prob of the choice under the policy
  at::Tensor target_tokens;  // [K, G, T] int64 the verifier's token at each slot of each sample
  at::Tensor supervised;     // [K, T] bool
  at::Tensor accepted;       // [K, G] int64 accepted prefix length against target_tokens
  at::Tensor rewards;        // [K, G] fp32 in [0, 1]
  at::Tensor advantages;     // [K, G] fp32
  double supervision_weight = 0;  // Σ decayed supervision weights (the optional DSpine term)
  // [kDrawCheckSize] fp64 on the device (DrawCheck). The ids it counts are already replaced by
  // token 0 in tokens and choices; the caller reads it with its other sums.
  at::Tensor draw_check;
};

// No bad id travels: checks drawn ids `tokens` [K, G, T] on the device and replaces every id
// outside [0, vocab) (a sampler fault) and every ops::kNoDraw (a row whose logits hold NaN or
// +inf) by token 0, in `tokens` and, where it has their shape (the backbone's choices are the
// ids), in `choices`, before a verifier or the policy term sees them. Returns the check
// ([kDrawCheckSize] fp64, DrawCheck) for the caller's next host read: no wait here.
at::Tensor screen_draws(at::Tensor& tokens, at::Tensor& choices, int64_t vocab);

// What a host copy of rollout.draw_check says, in words naming the batch row, anchor, slot and
// sample: a sampler fault (ids outside [0, vocab)), or rows whose logits hold NaN or +inf.
std::optional<std::string> draw_fault(const GspoRollout& rollout, const double* check,
                                      int64_t vocab);
std::optional<std::string> undrawn_rows(const GspoRollout& rollout, const double* check);

// Draws the rollout from a no-grad draft pass over `batch` (with full rows when sampling through
// the refinement head or when the verifier reads teacher states) and scores it with `verifier`.
// Uniforms come from the batch rows' rollout streams on the CPU (T·G per kept block of the row),
// so a row samples the same blocks on every device and in any grouping of rows.
GspoRollout gspo_rollout(const data::DraftBatch& batch, const DraftPass& pass,
                         model::DSpineDraftImpl& draft, const at::Tensor& lm_head,
                         const GspoRolloutSettings& settings, const BlockVerifier& verifier,
                         const RowStreams& streams);

// Greedy blocks [K, T] (argmax instead of sampling, the inference path) of the kept blocks.
at::Tensor gspo_greedy_tokens(const DraftPass& pass, const at::Tensor& kept,
                              model::DSpineDraftImpl& draft, const at::Tensor& lm_head,
                              const GspoRolloutSettings& settings);

// Leading slots where the token equals the target's, counting supervised slots only:
// tokens [K, G, T], target_tokens [K, G, T] (or [K, 1, T], shared by the group), supervised
// [K, T] → [K, G] int64.
at::Tensor accepted_prefix(const at::Tensor& tokens, const at::Tensor& target_tokens,
                           const at::Tensor& supervised);

// Σ_j Π_{i≤j} min(1, p(y_i)/q(y_i)) over supervised slots, divided by T: the target's and the
// draft's probabilities of the sampled tokens [K, G, T] → [K, G] fp32.
at::Tensor expected_acceptance(const at::Tensor& target_probs, const at::Tensor& draft_probs,
                               const at::Tensor& supervised);

// Per group of G: (r − mean) / (std + 1e-6) with the unbiased std, or r − mean. [K, G] → [K, G].
at::Tensor group_advantages(const at::Tensor& rewards, GspoAdvantageNorm norm);

}  // namespace dspine::objectives
