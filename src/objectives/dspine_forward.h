// The DSpine training forward (docs/model.md, "Anchors and blocks" to "CE-only prepass and
// replay"): owns the draft plus the frozen target embed_tokens / lm_head [V, H], turns a DraftBatch
// into anchor blocks, runs the draft and evaluates the full objective (or only its CE in the
// graph-free prepass) in chunks.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "data/batch.h"
#include "dist/communicator.h"
#include "model/dspine_draft.h"
#include "objectives/dspine_blocks.h"
#include "objectives/dspine_schedule.h"
#include "objectives/dspine_settings.h"
#include "objectives/row_streams.h"
#include "ops/vocab_objective_ops.h"
#include "ops/vocab_policy.h"

namespace dspine::objectives {

struct DSpineForwardOptions {
  int64_t step = 0;         // completed optimizer steps (schedules)
  int64_t total_steps = 0;  // horizon; <= 0: no replacement
  bool training = true;     // replacement is drawn only in training
  bool ce_only = false;     // graph-free CE prepass (§7.7); requires autograd disabled
  // Window CE̅ (replay): defined → used as the alignment scale's CE; undefined → [CE, D] are
  // all-reduced over `comm` inside this forward (immediate path, one collective).
  at::Tensor alignment_ce;
  // Without alignment_ce: host fp64 [ΣCE, ΣD] of this rank's micro-batches of the window that
  // were prepassed, added to this forward's own before the reduction (the replay of a window's
  // first micro-batch when it had no prepass). Undefined → this batch alone.
  at::Tensor prepassed_totals;
  // The training replay's form of that reduction: on the device where `comm` takes device
  // tensors, and ΣD > 0 left to the caller, which checks it when it reads the totals, so that
  // nothing here waits for the GPU between the forward and its backward. False: the totals are
  // reduced on the host and checked here.
  bool device_totals = false;
  dist::Communicator* comm = nullptr;
  const BlockOverrides* overrides = nullptr;
  // The GSPO policy term computed in the same vocabulary row pass (fused vocabulary path only):
  // the numerator then holds ρ·(policy loss) as well (ops/vocab_policy.h).
  const ops::VocabPolicy* policy = nullptr;
};

struct DSpineOutput {
  at::Tensor numerator;    // cw·CE + (1−cw)·L1 + R + β·CE̅·A (has grad); ce_only: CE
  at::Tensor denominator;  // D = Σ weights (fp32 scalar, local)
  at::Tensor loss;         // numerator / max(D, 1)
  // Detached sums (fp32 scalars); l1/refinement/alignment/coverage undefined when ce_only.
  at::Tensor ce, l1, refinement, alignment, correct, coverage, count;
  // The reduced [CE, D] (immediate path only): fp64 scalars, on the device with device_totals.
  at::Tensor global_ce, global_denominator;
  at::Tensor alignment_ce;                   // CE̅ used for the alignment scale
  DSpineSchedule schedule;
  BlockLayout blocks;
  at::Tensor replace;       // [B, N] bool or undefined
  at::Tensor position_ids;  // [B, S + N·bs]
  ops::VocabPolicyResult policy;  // with options.policy
};

// The draft's side of one batch (§5.2–5.9): anchor blocks laid out, the draft run, and its
// outputs rearranged into M = B·N rows of T proposals. The objective terms, the GSPO rollout and
// its update all start from here.
struct DraftPass {
  DSpineSchedule schedule;
  BlockLayout blocks;
  at::Tensor replace;       // [B, N] bool or undefined
  at::Tensor position_ids;  // [B, S + N·bs]
  at::Tensor hidden_rows;   // [M, T, H] final normed draft states
  at::Tensor labels;        // [M, T] int64 target tokens of the proposals
  at::Tensor predecessors;  // [M, T] int64 true previous tokens (slot 0: the anchor token)
  at::Tensor weights;       // [M, T] fp32 decayed supervision weights
  at::Tensor supervised;    // [M, T] bool
  // Full rows only:
  at::Tensor pre_rows;      // [M, T, H] last layer's states before its injection
  at::Tensor features;      // [M, L, T, r] post-injection features
  at::Tensor teacher_states;     // [B·S, H] target_last_hidden_states, one row per position
  at::Tensor teacher_positions;  // [M, T] int64: the position before each proposal's label
};

// A micro-batch's prepass kept for its replay (objective.dspine.prepass: keep_last): its full-rows
// draft pass with autograd's graph and, on the fused vocabulary path, its backbone vocabulary
// terms with theirs (they need no CE̅, so the replay adds only the candidate terms).
struct KeptPass {
  DraftPass pass;
  std::optional<ops::VocabObjectiveResult> vocabulary;
};

// The teacher states of a full-rows pass, the target's last hidden state before each label:
// [M, T, H], or [K, T, H] for the blocks `blocks` (int64 [K]) alone.
at::Tensor teacher_hidden(const DraftPass& pass, const at::Tensor& blocks = {});

class DSpineTrainingModel {
 public:
  // embed_tokens / lm_head: the target's [V, H] tables, moved to the draft's device and dtype
  // and never given gradients.
  DSpineTrainingModel(const DSpineSettings& settings, model::DSpineDraft draft,
                      at::Tensor embed_tokens, at::Tensor lm_head);

  // Draws anchors (and the replacement mask when training and p > 0) from the rows' streams,
  // unless overridden.
  DSpineOutput forward(const data::DraftBatch& batch, const RowStreams& streams,
                       const DSpineForwardOptions& options);

  // The random draws of forward alone: schedule, blocks and replacement mask; the draft is not
  // run.
  DraftPass sample_blocks(const data::DraftBatch& batch, const RowStreams& streams,
                          const DSpineForwardOptions& options);
  // The draft pass alone (same draws as forward). pre_rows, features and teacher only with
  // `full_rows` (the CE prepass needs none of them).
  DraftPass draft_pass(const data::DraftBatch& batch, const RowStreams& streams,
                       const DSpineForwardOptions& options, bool full_rows);
  // The objective terms of §7 on a draft pass (CE only when options.ce_only). `vocabulary`: the
  // pass's backbone vocabulary terms computed ahead (KeptPass; fused vocabulary path only).
  DSpineOutput objective(const DraftPass& pass, const DSpineForwardOptions& options,
                         const ops::VocabObjectiveResult* vocabulary = nullptr);
  // The prepass of a micro-batch whose replay it starts (autograd on): the full-rows draft pass,
  // its backbone vocabulary terms where they are fused, and the CE-only output a prepass reports
  // (its CE from those terms, else from the CE-only terms on the kept states, graph-free).
  std::pair<KeptPass, DSpineOutput> keep_pass(const data::DraftBatch& batch,
                                              const RowStreams& streams,
                                              const DSpineForwardOptions& options);

  // The vocabulary path of the backbone terms and the prepass: the fused vocabulary objective
  // (ops/vocab_objective_ops.h; its CUDA row kernel on CUDA, its ATen row pass elsewhere) or the
  // reference chunk functions. Defaults to model.fused_kernels on the lm_head's device.
  void use_fused_vocabulary(bool fused) { fused_vocabulary_ = fused; }
  bool fused_vocabulary() const { return fused_vocabulary_; }

  model::DSpineDraft draft() const { return draft_; }
  const at::Tensor& embed_tokens() const { return embed_tokens_; }
  const at::Tensor& lm_head() const { return lm_head_; }

  // For parity checks between kernel sets: the refinement's candidates are the draft's top-k
  // logits, a discrete choice that two evaluations rounding differently make differently among
  // near-tied logits. The fused vocabulary path keeps the candidates [M, T, k] it chose last;
  // candidates pinned here replace the reference terms' own top-k (undefined: unpinned).
  const at::Tensor& last_candidates() const { return last_candidates_; }
  void pin_candidates(at::Tensor candidates) { pinned_candidates_ = std::move(candidates); }

 private:
  model::DSpineModelConfig model_config_;  // the draft's
  DSpineSettings settings_;
  model::DSpineDraft draft_;
  at::Tensor embed_tokens_, lm_head_;
  int64_t mask_token_id_;
  bool fused_vocabulary_ = false;
  at::Tensor last_candidates_, pinned_candidates_;

  // The objective's sums: `backbone` = cw·CE + (1−cw)·L1 (with grad), the rest detached except
  // refinement and alignment.
  struct TermSums {
    at::Tensor backbone, ce, l1, refinement, alignment, correct, coverage;
    ops::VocabPolicyResult policy;
  };
  TermSums reference_terms(const DraftPass& pass);
  TermSums fused_terms(const DraftPass& pass, const ops::VocabPolicy* policy,
                       const ops::VocabObjectiveResult* vocabulary);
  ops::VocabObjectiveResult vocabulary_terms(const DraftPass& pass, const ops::VocabPolicy* policy);
  // The fields every output of a pass carries: schedule, blocks, replacement, D and the count.
  static DSpineOutput pass_output(const DraftPass& pass);
  std::vector<at::Tensor> trainable_parameters() const;
};

}  // namespace dspine::objectives
