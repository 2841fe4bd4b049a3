#include "ops/vocab_rows.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "core/error.h"
#include "kernels/vocab_objective.h"
#include "ops/kernel_launch.h"

namespace dspine::ops {
namespace {

kernels::VocabRows kernel_rows(const at::Tensor& z, const at::Tensor* t, const at::Tensor& labels) {
  if (!vocab_kernel_takes(z) || (t != nullptr && (t->strides() != z.strides() ||
                                                  t->size(1) != z.size(1) ||
                                                  t->scalar_type() != z.scalar_type()))) {
    fail("vocab objective kernel needs CUDA fp32/bf16 logits [n, V] with unit column stride "
         "(teacher alike); got {} {} on {}",
         c10::str(z.sizes()), c10::toString(z.scalar_type()), z.device().str());
  }
  kernels::VocabRows rows;
  rows.draft = z.data_ptr();
  rows.teacher = t != nullptr ? t->data_ptr() : nullptr;
  kernel_dtype(z.scalar_type(), &rows.type);
  rows.rows = z.size(0);
  rows.vocab = z.size(1);
  rows.row_stride = z.stride(0);
  rows.labels = labels.data_ptr<int64_t>();
  return rows;
}

VocabRowResults empty_results(const at::Tensor& z, bool teacher) {
  const auto f32 = z.options().dtype(at::kFloat);
  VocabRowResults out;
  out.ce = at::empty({z.size(0)}, f32);
  out.argmax = at::empty({z.size(0)}, z.options().dtype(at::kLong));
  if (teacher) {
    out.l1 = at::empty({z.size(0)}, f32);
    out.lse_teacher = at::empty({z.size(0)}, f32);
  }
  return out;
}

kernels::VocabRowStats kernel_stats(VocabRowResults& out) {
  kernels::VocabRowStats stats;
  stats.ce = out.ce.data_ptr<float>();
  stats.argmax = out.argmax.data_ptr<int64_t>();
  if (out.l1.defined()) stats.l1 = out.l1.data_ptr<float>();
  if (out.lse_teacher.defined()) stats.lse_teacher = out.lse_teacher.data_ptr<float>();
  return stats;
}

// ce and argmax of fp32 logits into `out` (ATen); returns their log-sum-exp.
at::Tensor draft_statistics(const at::Tensor& zf, const at::Tensor& labels, VocabRowResults& out) {
  auto lse = zf.logsumexp(-1);
  out.ce = lse - zf.gather(1, labels.unsqueeze(1)).squeeze(1);
  out.argmax = zf.argmax(-1);
  return lse;
}

// The top_k largest z per row (ATen): the head of a stable descending sort. topk would be cheaper
// but leaves open which of the values tied at the k-th it takes; this fixes the contract exactly,
// at the cost of an int64 [n, V] permutation (the reference path, and top_k > kVocabMaxTopK).
at::Tensor top_candidates(const at::Tensor& z, int64_t top_k) {
  return std::get<1>(z.sort(true, -1, true)).narrow(1, 0, top_k).contiguous();  // drop the rest
}

// q = exp(t − lse_t) at the candidates, fp32.
at::Tensor teacher_probabilities(const at::Tensor& t, const at::Tensor& candidates,
                                 const at::Tensor& lse_teacher) {
  return (t.gather(1, candidates).to(at::kFloat) - lse_teacher.unsqueeze(1)).exp();
}

void check_policy_gradient(const VocabRowGradient& g, const at::Tensor& z) {
  const int64_t n = z.size(0);
  const bool ok =
      g.policy_total.scalar_type() == at::kFloat && g.policy_total.sizes() == at::IntArrayRef{n} &&
      g.policy_targets.defined() && g.policy_targets.scalar_type() == at::kLong &&
      g.policy_targets.dim() == 2 && g.policy_targets.size(0) == n &&
      g.policy_targets.size(1) >= 1 && g.policy_targets.size(1) <= kernels::kVocabMaxPolicyGroup &&
      g.policy_coefficients.defined() && g.policy_coefficients.scalar_type() == at::kFloat &&
      g.policy_coefficients.sizes() == g.policy_targets.sizes();
  if (!ok) {
    fail(
        "vocab rows: the policy gradient needs fp32 policy_total [{}], int64 policy_targets "
        "[{}, G] and fp32 policy_coefficients [{}, G], 1 <= G <= {}",
        n, n, n, kernels::kVocabMaxPolicyGroup);
  }
}

VocabRowResults reference_rows(at::Tensor& z, const at::Tensor& t, const at::Tensor& labels,
                               const VocabRowGradient* gradient, int64_t top_k) {
  VocabRowResults out;
  const auto zf = z.to(at::kFloat);
  const auto tf = t.to(at::kFloat);
  const auto lse_z = draft_statistics(zf, labels, out);
  out.lse_teacher = tf.logsumexp(-1);
  if (top_k > 0) {  // before z becomes the gradient
    out.candidates = top_candidates(z, top_k);
    out.teacher_candidates = teacher_probabilities(t, out.candidates, out.lse_teacher);
  }
  const auto p = (zf - lse_z.unsqueeze(1)).exp();
  const auto diff = p - (tf - out.lse_teacher.unsqueeze(1)).exp();
  const auto sign = diff.sign();  // sign(0) = 0
  out.l1 = diff.abs().sum(-1);
  if (gradient != nullptr) {
    const auto signed_mass = (p * sign).sum(-1, true);
    auto g = gradient->ce_weight * p + gradient->l1_weight * p * (sign - signed_mass);
    g.scatter_add_(1, labels.unsqueeze(1),
                   at::full({z.size(0), 1}, -gradient->ce_weight, g.options()));
    g.mul_(gradient->weights.unsqueeze(1));
    if (gradient->policy_total.defined()) {
      g.add_(p * gradient->policy_total.unsqueeze(1));
      const auto& targets = gradient->policy_targets;
      g.scatter_add_(1, targets.clamp_min(0),
                     -at::where(targets.ge(0), gradient->policy_coefficients, 0.0));
    }
    z.copy_(g);
  }
  return out;
}

}  // namespace

bool vocab_kernel_takes(const at::Tensor& logits) {
  return logits.is_cuda() && logits.dim() == 2 && logits.stride(1) == 1 &&
         (logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16);
}

VocabRowResults vocab_rows(at::Tensor& z, const at::Tensor& t, const at::Tensor& labels,
                           const VocabRowGradient* gradient, bool use_kernel, int64_t top_k,
                           const at::Tensor& teacher_rows) {
  if (top_k < 0 || top_k > z.size(-1)) {
    fail("vocab rows: top_k must lie in [0, {}], got {}", z.size(-1), top_k);
  }
  if (teacher_rows.defined() &&
      (teacher_rows.dim() != 1 || teacher_rows.size(0) != z.size(0) ||
       teacher_rows.scalar_type() != at::kLong || teacher_rows.device() != z.device())) {
    fail("vocab rows: teacher_rows must be int64 [{}] on {}, got {} {} on {}", z.size(0),
         z.device().str(), c10::toString(teacher_rows.scalar_type()),
         c10::str(teacher_rows.sizes()), teacher_rows.device().str());
  }
  if (!teacher_rows.defined() && t.size(0) != z.size(0)) {
    fail("vocab rows: teacher logits {} must have one row per draft row {}", c10::str(t.sizes()),
         c10::str(z.sizes()));
  }
  // Row r's teacher logits for the ATen parts: [n, V].
  auto teacher_per_row = [&] {
    return teacher_rows.defined() ? t.index_select(0, teacher_rows) : t;
  };
  if (!use_kernel) return reference_rows(z, teacher_per_row(), labels, gradient, top_k);
  const c10::cuda::CUDAGuard guard(z.device());
  auto rows = kernel_rows(z, &t, labels);
  at::Tensor teacher_index;
  if (teacher_rows.defined()) {
    teacher_index = teacher_rows.contiguous();
    rows.teacher_rows = teacher_index.data_ptr<int64_t>();
  }
  auto out = empty_results(z, true);
  auto stats = kernel_stats(out);
  const bool kernel_selects = top_k <= kernels::kVocabMaxTopK;
  if (top_k > 0) {
    if (kernel_selects) {
      out.candidates = at::empty({z.size(0), top_k}, z.options().dtype(at::kLong));
      out.teacher_candidates = at::empty({z.size(0), top_k}, z.options().dtype(at::kFloat));
      stats.top_k = static_cast<int>(top_k);
      stats.top_indices = out.candidates.data_ptr<int64_t>();
      stats.top_teacher_probs = out.teacher_candidates.data_ptr<float>();
    } else {
      out.candidates = top_candidates(z, top_k);  // before z becomes the gradient
    }
  }
  kernels::VocabGradient coefficients;
  at::Tensor weights, policy_total, policy_targets, policy_coefficients;
  if (gradient != nullptr) {
    weights = gradient->weights.to(at::kFloat).contiguous();
    coefficients.weights = weights.data_ptr<float>();
    coefficients.ce_weight = static_cast<float>(gradient->ce_weight);
    coefficients.l1_weight = static_cast<float>(gradient->l1_weight);
    if (gradient->policy_total.defined()) {
      check_policy_gradient(*gradient, z);
      policy_total = gradient->policy_total.contiguous();
      policy_targets = gradient->policy_targets.contiguous();
      policy_coefficients = gradient->policy_coefficients.contiguous();
      coefficients.policy_total = policy_total.data_ptr<float>();
      coefficients.policy_targets = policy_targets.data_ptr<int64_t>();
      coefficients.policy_coefficients = policy_coefficients.data_ptr<float>();
      coefficients.policy_group = static_cast<int>(policy_targets.size(1));
    }
  }
  check_launch(kernels::vocab_objective_rows(rows, stats,
                                             gradient != nullptr ? &coefficients : nullptr,
                                             at::cuda::getCurrentCUDAStream()),
               "vocab objective rows", z);
  if (top_k > 0 && !kernel_selects) {
    out.teacher_candidates =
        teacher_probabilities(teacher_per_row(), out.candidates, out.lse_teacher);
  }
  return out;
}

VocabRowResults vocab_ce_rows(const at::Tensor& z, const at::Tensor& labels, bool use_kernel) {
  VocabRowResults out;
  if (!use_kernel) {
    draft_statistics(z.to(at::kFloat), labels, out);
    return out;
  }
  const c10::cuda::CUDAGuard guard(z.device());
  auto rows = kernel_rows(z, nullptr, labels);
  out = empty_results(z, false);
  check_launch(kernels::vocab_ce_rows(rows, kernel_stats(out), at::cuda::getCurrentCUDAStream()),
               "vocab CE rows", z);
  return out;
}

}  // namespace dspine::ops
