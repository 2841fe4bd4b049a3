// Row kernels of the fused vocabulary objective (docs/model.md, "Fused vocabulary objective"), on
// raw device pointers. One block per row of draft logits z [rows, V] (and its row of teacher logits
// t, of z's type and row stride), statistics in fp32, so no fp32 [rows, V] intermediate exists:
//   pass 1  max / sum-exp of z and of t, argmax of z, and optionally the top-k of z (warp lists
//           filtered by one compare per element, merged per row; kernels/vocab_topk.cuh) with the
//           teacher's probabilities there;
//   pass 2  p = softmax(z), q = softmax(t): l1 = Σ|p − q|, S = Σ p·sign(p − q), ce = lse_z − z_y;
//   pass 3  (gradient only) z_i := w·[a_ce·(p_i − [i = y]) + a_l1·p_i·(sign(p_i − q_i) − S)],
//           the gradient of w·(a_ce·ce + a_l1·l1) with respect to z_i, in z's own type
//           (sign(0) = 0, as in the derivative of |x| everywhere else in the trainer); with a
//           GSPO policy term over softmax(z) itself, + C·p_i − Σ_{g: y_g = i} c_g, rounded once.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/norm_swiglu_types.h"

namespace dspine::kernels {

// Row-major logits with unit column stride; fp32 or bf16.
struct VocabRows {
  void* draft = nullptr;           // z; overwritten by the gradient when one is written
  const void* teacher = nullptr;   // t; nullptr for the CE-only form
  DType type = DType::kBFloat16;
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t row_stride = 0;          // elements, shared by z and t
  const int64_t* labels = nullptr; // [rows], each in [0, vocab) (the caller checks)
  // [rows] or nullptr: row r's teacher logits are row teacher_rows[r] of t (the caller checks the
  // range), so rows that share a teacher share one row of t; nullptr: row r.
  const int64_t* teacher_rows = nullptr;
};

// Per-row fp32 / int64 outputs, each [rows]; a null pointer is not written.
struct VocabRowStats {
  float* ce = nullptr;           // lse_z − z_y
  float* l1 = nullptr;           // Σ|p − q| (teacher form)
  float* lse_draft = nullptr;    // log Σ exp z
  float* lse_teacher = nullptr;  // log Σ exp t (teacher form): q_i = exp(t_i − lse_t)
  int64_t* argmax = nullptr;     // first index of max z (NaN ignored; with top_k, top_indices[0])
  // The top_k largest z per row, [rows, top_k] row-major, in the order of a stable descending
  // sort (equal values by lower index; NaN above +inf, as torch.topk), and q there (teacher form).
  int top_k = 0;                         // 0: none; at most kVocabMaxTopK and vocab
  int64_t* top_indices = nullptr;
  float* top_teacher_probs = nullptr;    // exp(t_i − lse_t)
};

// The largest top_k the kernels take (larger: cudaErrorInvalidValue).
constexpr int kVocabMaxTopK = 32;

// The largest number of policy samples per row the gradient takes.
constexpr int kVocabMaxPolicyGroup = 64;

// Gradient coefficients: w [rows] fp32, a_ce, a_l1; optionally the GSPO policy term of the same
// rows at logits scale 1 (docs/gspo.md, "The policy term in the row pass"): its gradient
// C_r·p_i − Σ_{g: y_{r,g} = i} c_{r,g} joins the supervised one before rounding.
struct VocabGradient {
  const float* weights = nullptr;
  float ce_weight = 1.f;
  float l1_weight = 0.f;
  const float* policy_total = nullptr;         // [rows] C_r = Σ_g c_{r,g}; nullptr: no policy
  const int64_t* policy_targets = nullptr;     // [rows, policy_group]; < 0: no sample there
  const float* policy_coefficients = nullptr;  // [rows, policy_group] c_{r,g}
  int policy_group = 0;                        // at most kVocabMaxPolicyGroup
};

// The teacher form (passes 1–2, and pass 3 when `gradient` is non-null).
cudaError_t vocab_objective_rows(const VocabRows& rows, const VocabRowStats& stats,
                                 const VocabGradient* gradient, cudaStream_t stream);

// The CE-only form (no teacher, no gradient): pass 1 on z, ce, lse_draft, argmax, top_indices.
cudaError_t vocab_ce_rows(const VocabRows& rows, const VocabRowStats& stats, cudaStream_t stream);

}  // namespace dspine::kernels
