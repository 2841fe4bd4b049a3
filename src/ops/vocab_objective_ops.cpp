#include "ops/vocab_objective_ops.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "core/error.h"
#include "ops/vocab_rows.h"

namespace dspine::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void check_rows(const at::Tensor& hidden, const at::Tensor& labels, const at::Tensor& lm_head,
                const VocabObjectiveOptions& options) {
  if (lm_head.dim() != 2) fail("vocab objective: lm_head must be [V, H], got {}",
                               c10::str(lm_head.sizes()));
  const int64_t vocab = lm_head.size(0);
  if (hidden.dim() != 2 || hidden.size(1) != lm_head.size(1) || hidden.size(0) == 0) {
    fail("vocab objective: hidden must be [rows > 0, {}], got {}", lm_head.size(1),
         c10::str(hidden.sizes()));
  }
  if (hidden.scalar_type() != lm_head.scalar_type() || hidden.device() != lm_head.device()) {
    fail("vocab objective: hidden ({} on {}) and lm_head ({} on {}) must share dtype and device",
         c10::toString(hidden.scalar_type()), hidden.device().str(),
         c10::toString(lm_head.scalar_type()), lm_head.device().str());
  }
  if (labels.dim() != 1 || labels.size(0) != hidden.size(0) || labels.scalar_type() != at::kLong ||
      labels.device() != hidden.device()) {
    fail("vocab objective: labels must be int64 [{}] on {}, got {} {} on {}", hidden.size(0),
         hidden.device().str(), c10::toString(labels.scalar_type()), c10::str(labels.sizes()),
         labels.device().str());
  }
  if (options.top_k < 0 || options.top_k > vocab) {
    fail("vocab objective: top_k must lie in [0, {}], got {}", vocab, options.top_k);
  }
  if (options.chunk_rows < 0) {
    fail("vocab objective: chunk_rows must be >= 0, got {}", options.chunk_rows);
  }
  const auto bad = ((labels < 0) | (labels >= vocab)).nonzero();
  if (bad.numel() > 0) {
    fail("vocab objective: label {} at row {} is outside [0, {})",
         labels[bad[0][0].item<int64_t>()].item<int64_t>(), bad[0][0].item<int64_t>(), vocab);
  }
}

void check_teacher(const at::Tensor& hidden, const at::Tensor& teacher, const at::Tensor& weights) {
  if (teacher.sizes() != hidden.sizes() || teacher.scalar_type() != hidden.scalar_type() ||
      teacher.device() != hidden.device()) {
    fail("vocab objective: teacher_hidden {} {} must match hidden {} {}",
         c10::toString(teacher.scalar_type()), c10::str(teacher.sizes()),
         c10::toString(hidden.scalar_type()), c10::str(hidden.sizes()));
  }
  if (weights.dim() != 1 || weights.size(0) != hidden.size(0) ||
      weights.scalar_type() != at::kFloat || weights.device() != hidden.device()) {
    fail("vocab objective: weights must be fp32 [{}] on {}, got {} {} on {}", hidden.size(0),
         hidden.device().str(), c10::toString(weights.scalar_type()), c10::str(weights.sizes()),
         weights.device().str());
  }
}

int64_t chunk_rows(const VocabObjectiveOptions& options, const at::Tensor& lm_head,
                   int64_t logits_per_row) {
  return options.chunk_rows > 0
             ? options.chunk_rows
             : vocab_chunk_rows(lm_head.size(0), lm_head.element_size(), logits_per_row);
}

// The whole objective, chunk by chunk; with grad_hidden, also dX = Σ_chunks g @ lm_head.
VocabObjectiveResult run_chunks(const at::Tensor& hidden, const at::Tensor& teacher,
                                const at::Tensor& labels, const at::Tensor& weights,
                                const at::Tensor& lm_head, const VocabObjectiveOptions& options,
                                at::Tensor* grad_hidden) {
  const int64_t rows = hidden.size(0), k = options.top_k;
  const auto f32 = hidden.options().dtype(at::kFloat);
  VocabObjectiveResult out;
  out.ce = at::empty({rows}, f32);
  out.l1 = at::empty({rows}, f32);
  out.argmax = at::empty({rows}, labels.options());
  out.candidates = at::empty({rows, k}, labels.options());
  out.teacher_candidates = at::empty({rows, k}, f32);
  if (grad_hidden != nullptr) *grad_hidden = at::empty(hidden.sizes(), hidden.options());
  VocabRowGradient gradient{at::Tensor(), options.ce_weight, 1.0 - options.ce_weight};
  const auto head_t = lm_head.t();
  const int64_t step = chunk_rows(options, lm_head, 2);
  for (int64_t begin = 0; begin < rows; begin += step) {
    const int64_t end = std::min(rows, begin + step);
    auto z = at::mm(hidden.slice(0, begin, end), head_t);
    const auto t = at::mm(teacher.slice(0, begin, end), head_t);
    const auto y = labels.slice(0, begin, end);
    gradient.weights = weights.slice(0, begin, end);
    auto r = vocab_rows(z, t, y, grad_hidden != nullptr ? &gradient : nullptr,
                        options.use_kernel && vocab_kernel_takes(z), k);
    out.ce.slice(0, begin, end).copy_(r.ce);
    out.l1.slice(0, begin, end).copy_(r.l1);
    out.argmax.slice(0, begin, end).copy_(r.argmax);
    if (k > 0) {
      out.candidates.slice(0, begin, end).copy_(r.candidates);
      out.teacher_candidates.slice(0, begin, end).copy_(r.teacher_candidates);
    }
    if (grad_hidden != nullptr) {
      auto rows_grad = grad_hidden->slice(0, begin, end);
      at::mm_out(rows_grad, z, lm_head);
    }
  }
  out.loss = (weights * (options.ce_weight * out.ce + (1.0 - options.ce_weight) * out.l1)).sum();
  return out;
}

// Forward = the chunked objective with its gradient; backward = grad_output · dX.
struct VocabObjectiveFunction : torch::autograd::Function<VocabObjectiveFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden,
                               const at::Tensor& teacher, const at::Tensor& labels,
                               const at::Tensor& weights, const at::Tensor& lm_head,
                               double ce_weight, int64_t top_k, int64_t chunk, bool use_kernel) {
    const VocabObjectiveOptions options{ce_weight, top_k, chunk, use_kernel};
    at::Tensor grad_hidden;
    auto r = run_chunks(hidden, teacher, labels, weights, lm_head, options, &grad_hidden);
    ctx->saved_data["grad_hidden"] = grad_hidden;
    ctx->mark_non_differentiable({r.ce, r.l1, r.argmax, r.candidates, r.teacher_candidates});
    return {r.loss, r.ce, r.l1, r.argmax, r.candidates, r.teacher_candidates};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto grad_hidden = ctx->saved_data["grad_hidden"].toTensor();
    ctx->saved_data.erase("grad_hidden");  // dX is used once: free it with this backward
    variable_list grads(9);
    // In place (no second [rows, H] copy), by a host scalar so that the scale is applied in fp32,
    // not rounded to a bf16 tensor first (one synchronisation per backward).
    grads[0] = grad_hidden.mul_(grad_outputs[0].item<double>());
    return grads;
  }
};

}  // namespace

int64_t vocab_chunk_rows(int64_t vocab, int64_t element_bytes, int64_t logits_per_row) {
  constexpr int64_t kTileRows = 256;
  const int64_t rows =
      std::max<int64_t>(1, kVocabChunkBytes / (vocab * element_bytes * logits_per_row));
  return rows >= kTileRows ? rows / kTileRows * kTileRows : rows;
}

VocabObjectiveResult vocab_objective(const at::Tensor& hidden, const at::Tensor& teacher_hidden,
                                     const at::Tensor& labels, const at::Tensor& weights,
                                     const at::Tensor& lm_head,
                                     const VocabObjectiveOptions& options) {
  check_rows(hidden, labels, lm_head, options);
  check_teacher(hidden, teacher_hidden, weights);
  const auto teacher = teacher_hidden.detach();
  const auto y = labels.contiguous();
  if (!at::GradMode::is_enabled() || !hidden.requires_grad()) {
    return run_chunks(hidden, teacher, y, weights, lm_head, options, nullptr);
  }
  auto out = VocabObjectiveFunction::apply(hidden, teacher, y, weights.detach(),
                                           lm_head.detach(), options.ce_weight, options.top_k,
                                           options.chunk_rows, options.use_kernel);
  return {out[0], out[1], out[2], out[3], out[4], out[5]};
}

VocabCeResult vocab_ce(const at::Tensor& hidden, const at::Tensor& labels,
                       const at::Tensor& lm_head, const VocabObjectiveOptions& options) {
  check_rows(hidden, labels, lm_head, options);
  at::NoGradGuard no_grad;
  const int64_t rows = hidden.size(0);
  const auto y = labels.contiguous();
  VocabCeResult out{at::empty({rows}, hidden.options().dtype(at::kFloat)),
                    at::empty({rows}, y.options())};
  const auto head_t = lm_head.t();
  const int64_t step = chunk_rows(options, lm_head, 1);
  for (int64_t begin = 0; begin < rows; begin += step) {
    const int64_t end = std::min(rows, begin + step);
    const auto z = at::mm(hidden.slice(0, begin, end), head_t);
    auto r = vocab_ce_rows(z, y.slice(0, begin, end), options.use_kernel && vocab_kernel_takes(z));
    out.ce.slice(0, begin, end).copy_(r.ce);
    out.argmax.slice(0, begin, end).copy_(r.argmax);
  }
  return out;
}

}  // namespace dspine::ops
