// The fused vocabulary objective (docs/model.md, "Fused vocabulary objective"): the DSpine
// backbone terms — CE against the labels, L1 between the draft's and the teacher's softmax, the
// draft's argmax and top-k candidates with the teacher's probabilities there — over row chunks of
// the frozen lm_head projection. Per chunk: the two logits GEMMs in the training dtype, the row
// pass (ops/vocab_rows.h, top-k included), and with a gradient wanted the logits gradient written
// over the draft logits and dX = g @ lm_head. Rows sharing a teacher state share its logits. Only
// dX [rows, H] outlives a chunk: no [rows, V] tensor, no full-width teacher softmax, nothing
// recomputed in backward.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "ops/vocab_policy.h"

namespace dspine::ops {

struct VocabObjectiveOptions {
  double ce_weight = 1.0;   // a_ce; a_l1 = 1 − ce_weight
  int64_t top_k = 0;        // candidates per row (0: none)
  int64_t chunk_rows = 0;   // rows per chunk; 0: vocab_chunk_rows
  bool use_kernel = false;  // the CUDA row kernel where it takes the logits (CUDA fp32/bf16);
                            // otherwise, or when false, the ATen row pass
  // The GSPO policy term of the same rows (ops/vocab_policy.h), or none. Chunks then hold whole
  // blocks, and the loss and its gradient hold ρ·(policy loss) too.
  const VocabPolicy* policy = nullptr;
};

struct VocabObjectiveResult {
  at::Tensor loss;                // Σ w·(a_ce·ce + a_l1·l1), fp32 scalar, differentiable in hidden
  at::Tensor ce, l1;              // [rows] fp32, detached
  at::Tensor argmax;              // [rows] int64
  at::Tensor candidates;          // [rows, k] int64, by descending draft logit
  at::Tensor teacher_candidates;  // [rows, k] fp32 teacher probabilities at the candidates
  VocabPolicyResult policy;       // with options.policy
};

// hidden [rows, H] (the draft states; the only input given a gradient), teacher_hidden [rows, H],
// labels [rows] int64 in [0, V), weights [rows] fp32, lm_head [V, H] (frozen). hidden, teacher
// and lm_head share dtype and device. The gradient is computed in the forward when autograd is on
// and hidden requires it; backward scales it by the incoming gradient.
// With teacher_index (int64 [rows], each in [0, P)), teacher_hidden is [P, H] and row r's teacher
// state is teacher_hidden[teacher_index[r]]: each chunk projects every teacher row it uses once.
// DSpine's blocks overlap, so its proposals share target positions (at the recipe's size a chunk
// of 1,024 proposal rows reads about 385 positions).
VocabObjectiveResult vocab_objective(const at::Tensor& hidden, const at::Tensor& teacher_hidden,
                                     const at::Tensor& labels, const at::Tensor& weights,
                                     const at::Tensor& lm_head,
                                     const VocabObjectiveOptions& options,
                                     const at::Tensor& teacher_index = {});

// The policy term alone (no supervised terms, no teacher): loss = ρ·(policy loss), with grad in
// hidden [M·T, H] when autograd is on; the same row chunks, one logits GEMM and one dX GEMM each.
VocabObjectiveResult vocab_policy_objective(const at::Tensor& hidden, const at::Tensor& lm_head,
                                            const VocabObjectiveOptions& options);

// The CE-only form of the prepass (no teacher, no gradient): ce [rows] fp32 and argmax [rows].
struct VocabCeResult {
  at::Tensor ce, argmax;
};
VocabCeResult vocab_ce(const at::Tensor& hidden, const at::Tensor& labels,
                       const at::Tensor& lm_head, const VocabObjectiveOptions& options);

// Bytes of logits a chunk may hold (~0.6 GiB: at the recipe's V = 151,936 in bf16, about a
// thousand rows of draft and teacher logits, enough to keep the GEMMs efficient).
constexpr int64_t kVocabChunkBytes = int64_t(614) << 20;
// Rows per chunk so that `logits_per_row` rows of `vocab` logits of `element_bytes` each fit in
// kVocabChunkBytes (at least 1), rounded down to whole 256-row GEMM tiles where the budget allows
// (no partly filled last tile row in the chunk's GEMMs; the recipe's 15,360 rows are fifteen
// chunks of 1,024; docs/benchmarks.md has its measurement).
int64_t vocab_chunk_rows(int64_t vocab, int64_t element_bytes, int64_t logits_per_row);

// Rows of teacher logits vocab_objective projects for teacher_index (int64 [rows], each in
// [0, positions)) in chunks of chunk_rows rows: each chunk's distinct positions, summed.
int64_t vocab_teacher_rows(const at::Tensor& teacher_index, int64_t positions,
                           int64_t chunk_rows);

}  // namespace dspine::ops
