// Per-chunk DSpine objective terms (docs/model.md, "The supervised objective") and the CE-only
// terms of the prepass ("CE-only prepass and replay"), over blocks laid out as [c, T, ...] (c
// blocks of T proposals).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "model/dspine_draft.h"
#include "objectives/dspine_settings.h"

namespace dspine::objectives {

// Flattened vocabulary projection (§9): x [..., H] -> [rows, H] @ head^T -> [..., V].
at::Tensor project_logits(const at::Tensor& x, const at::Tensor& lm_head);

// Chunk input order of objective_terms.
enum FullTermInput : size_t {
  kHidden,         // [c, T, H] final normed draft states
  kPre,            // [c, T, H] last layer's pre-injection states
  kFeatures,       // [c, L, T, r] post-injection features
  kLabels,         // [c, T] int64
  kPredecessors,   // [c, T] int64 true previous tokens
  kTeacherHidden,  // [c, T, H]
  kWeights,        // [c, T] fp32
  kSupervised,     // [c, T] bool
  kFullTermInputs
};
// An optional chunk input after the others: [c, T, k] int64 candidates that replace the draft's
// top-k (DSpineTrainingModel::pin_candidates).
constexpr size_t kPinnedCandidates = kFullTermInputs;
// Output order of objective_terms.
enum FullTermOutput : size_t { kCe, kL1, kRefine, kAlign, kCorrect, kCoverage, kFullTermOutputs };

// The reference backbone terms of a chunk (full-width fp32 softmaxes of the draft and teacher
// logits): Σw·ce and Σw·l1 (with grad), the correct count, the draft's top-k candidates (or the
// given `candidates` [..., k]) and the teacher's probabilities there (no grad). hidden /
// teacher_hidden [..., H], the rest [...].
struct BackboneTerms {
  at::Tensor ce, l1, correct, candidates, candidate_mass;
};
BackboneTerms backbone_terms(const at::Tensor& hidden, const at::Tensor& teacher_hidden,
                             const at::Tensor& labels, const at::Tensor& weights,
                             const at::Tensor& supervised, const at::Tensor& lm_head,
                             int64_t top_k, const at::Tensor& candidates = {});

// The six sums of §7.1 step 10: CE = Σw·ce, L1 = Σw·l1, R = Σw·(cw·rce + (1−cw)·rl1·gate),
// A = Σ_l Σ w·(1 − cos(feature_l, code_y)), correct, coverage. `draft` supplies refine() and the
// codes; `lm_head` is frozen; `top_k` is model.dspine.top_k (the refined candidates).
std::vector<at::Tensor> objective_terms(model::DSpineDraftImpl& draft, const at::Tensor& lm_head,
                                        const DSpineSettings& settings, int64_t top_k,
                                        const std::vector<at::Tensor>& chunk);

// Chunk input order of candidate_terms (the fused path: the backbone terms come from
// ops/vocab_objective_ops.h, which also picks the candidates).
enum CandidateTermInput : size_t {
  kCandPre,            // [c, T, H]
  kCandFeatures,       // [c, L, T, r]
  kCandLabels,         // [c, T] int64
  kCandPredecessors,   // [c, T] int64
  kCandWeights,        // [c, T] fp32
  kCandSupervised,     // [c, T] bool
  kCandidates,         // [c, T, k] int64 top-k of the draft logits
  kCandidateMass,      // [c, T, k] fp32 teacher probabilities at the candidates
  kCandidateTermInputs
};
// Output order of candidate_terms.
enum CandidateTermOutput : size_t { kCandRefine, kCandAlign, kCandCoverage, kCandidateTermOutputs };

// {R, A, coverage} of objective_terms from given candidates: the refinement and alignment terms
// without any vocabulary-wide work.
std::vector<at::Tensor> candidate_terms(model::DSpineDraftImpl& draft, const at::Tensor& lm_head,
                                        const DSpineSettings& settings,
                                        const std::vector<at::Tensor>& chunk);

// Chunk input order of ce_terms: hidden [c, T, H], labels, weights, supervised.
enum CeTermInput : size_t { kCeHidden, kCeLabels, kCeWeights, kCeSupervised, kCeTermInputs };

// {CE = Σw·(−log_softmax(z)[y]), correct}: no teacher, L1, top-k, refinement or alignment.
std::vector<at::Tensor> ce_terms(const at::Tensor& lm_head, const std::vector<at::Tensor>& chunk);

}  // namespace dspine::objectives
