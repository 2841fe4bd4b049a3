// One chunk's row pass of the fused vocabulary objective (docs/model.md, "Fused vocabulary
// objective"): per-row statistics of draft logits z [n, V] and teacher logits t [n, V], and
// optionally the logits gradient written over z. The CUDA row kernel (kernels/vocab_objective.h)
// or the same math in ATen (the CPU path and the kernel's parity oracle).
#pragma once

#include <ATen/core/Tensor.h>

namespace dspine::ops {

// Per-row results, [n] each: fp32 ce, l1 (teacher form), lse_t (teacher form), int64 argmax; with
// top_k > 0 also the candidates, int64 [n, top_k]: the top_k largest z of each row as a stable
// descending sort orders them (equal values by lower index), and the teacher's probabilities
// q = softmax(t) there, fp32 [n, top_k].
struct VocabRowResults {
  at::Tensor ce, l1, lse_teacher, argmax;
  at::Tensor candidates, teacher_candidates;
};

// Gradient request: w [n] fp32; g = w·(a_ce·(p − δ_y) + a_l1·p·(sign(p − q) − Σ p·sign(p − q))).
// With policy_total defined, the GSPO policy term over softmax(z) itself (logits scale 1) is
// added before rounding: C_r·p − Σ_g c_{r,g}·δ_{y_{r,g}}.
struct VocabRowGradient {
  at::Tensor weights;
  double ce_weight = 1.0;
  double l1_weight = 0.0;
  at::Tensor policy_total;         // [n] fp32 C_r (0 on masked rows)
  at::Tensor policy_targets;       // [n, G] int64; < 0: no sample
  at::Tensor policy_coefficients;  // [n, G] fp32 c_{r,g} (0 where the target is < 0)
};

// Whether the CUDA row kernel takes these logits (CUDA, fp32 or bf16, unit column stride).
bool vocab_kernel_takes(const at::Tensor& logits);

// Teacher form. z and t: [n, V] of one dtype and layout, labels [n] int64 in [0, V). With a
// gradient, z is overwritten by it (same dtype). use_kernel: the CUDA kernel (vocab_kernel_takes
// must hold), else ATen. top_k in [0, V]: the kernel selects up to kernels::kVocabMaxTopK in its
// first pass; beyond, ATen (a stable sort, [n, V] int64 transient) does. With teacher_rows (int64
// [n], each in [0, u)), t is [u, V] and row r's teacher is t[teacher_rows[r]]: rows that share a
// teacher read one row of t.
VocabRowResults vocab_rows(at::Tensor& z, const at::Tensor& t, const at::Tensor& labels,
                           const VocabRowGradient* gradient, bool use_kernel, int64_t top_k = 0,
                           const at::Tensor& teacher_rows = {});

// CE-only form: ce and argmax of z (l1 and lse_teacher undefined).
VocabRowResults vocab_ce_rows(const at::Tensor& z, const at::Tensor& labels, bool use_kernel);

}  // namespace dspine::ops
