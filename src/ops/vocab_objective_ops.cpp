#include "ops/vocab_objective_ops.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "core/error.h"
#include "ops/vocab_rows.h"

namespace dspine::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// An index per row of hidden (`name`: int64 [rows] on hidden's device), each in [0, end); an
// entry outside is named with its row (`entry` at row r).
void check_row_index(const at::Tensor& index, const at::Tensor& hidden, int64_t end,
                     const char* name, const char* entry) {
  if (index.dim() != 1 || index.size(0) != hidden.size(0) || index.scalar_type() != at::kLong ||
      index.device() != hidden.device()) {
    fail("vocab objective: {} must be int64 [{}] on {}, got {} {} on {}", name, hidden.size(0),
         hidden.device().str(), c10::toString(index.scalar_type()), c10::str(index.sizes()),
         index.device().str());
  }
  const auto bad = ((index < 0) | (index >= end)).nonzero();
  if (bad.numel() > 0) {
    fail("vocab objective: {} {} at row {} is outside [0, {})", entry,
         index[bad[0][0].item<int64_t>()].item<int64_t>(), bad[0][0].item<int64_t>(), end);
  }
}

void check_hidden(const at::Tensor& hidden, const at::Tensor& lm_head,
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
  if (options.top_k < 0 || options.top_k > vocab) {
    fail("vocab objective: top_k must lie in [0, {}], got {}", vocab, options.top_k);
  }
  if (options.chunk_rows < 0) {
    fail("vocab objective: chunk_rows must be >= 0, got {}", options.chunk_rows);
  }
}

void check_rows(const at::Tensor& hidden, const at::Tensor& labels, const at::Tensor& lm_head,
                const VocabObjectiveOptions& options) {
  check_hidden(hidden, lm_head, options);
  check_row_index(labels, hidden, lm_head.size(0), "labels", "label");
}

void check_teacher(const at::Tensor& hidden, const at::Tensor& teacher, const at::Tensor& index,
                   const at::Tensor& weights) {
  const bool by_position =
      teacher.dim() == 2 && teacher.size(0) > 0 && teacher.size(1) == hidden.size(1);
  const bool shape = index.defined() ? by_position : teacher.sizes() == hidden.sizes();
  if (!shape || teacher.scalar_type() != hidden.scalar_type() ||
      teacher.device() != hidden.device()) {
    fail("vocab objective: teacher_hidden {} {} must match hidden {} {}{}",
         c10::toString(teacher.scalar_type()), c10::str(teacher.sizes()),
         c10::toString(hidden.scalar_type()), c10::str(hidden.sizes()),
         index.defined() ? " in dtype, device and width (one row per teacher position)" : "");
  }
  if (index.defined()) {
    check_row_index(index, hidden, teacher.size(0), "teacher_index", "teacher_index");
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

// The teacher rows of each chunk of `step` rows: chunk c projects the teacher states at
// positions[offsets[c], offsets[c + 1]) (distinct, ascending), and its row r reads row local[r]
// of that projection.
struct ChunkTeachers {
  at::Tensor positions, local;
  std::vector<int64_t> offsets;
};

ChunkTeachers chunk_teachers(const at::Tensor& index, int64_t positions, int64_t step) {
  const int64_t rows = index.size(0), chunks = (rows + step - 1) / step;
  const auto chunk = at::arange(rows, index.options()).div(step, "floor");
  // Keys order by chunk, then position, so one sort finds every chunk's distinct positions.
  const auto unique = at::_unique2(chunk * positions + index, /*sorted=*/true,
                                   /*return_inverse=*/true, /*return_counts=*/false);
  const auto& keys = std::get<0>(unique);
  const auto key_chunk = keys.div(positions, "floor");
  const auto per_chunk =
      at::zeros({chunks}, index.options()).index_add_(0, key_chunk, at::ones_like(key_chunk));
  ChunkTeachers out;
  out.positions = keys - key_chunk * positions;
  out.local = std::get<1>(unique) - (per_chunk.cumsum(0) - per_chunk).index_select(0, chunk);
  const auto sizes = per_chunk.cpu();  // one synchronisation for every chunk's size
  const auto size = sizes.accessor<int64_t, 1>();
  out.offsets.assign(1, 0);
  for (int64_t c = 0; c < chunks; ++c) out.offsets.push_back(out.offsets.back() + size[c]);
  return out;
}

// The whole objective, chunk by chunk; with grad_hidden, also dX = Σ_chunks g @ lm_head. Without
// a teacher, the policy term alone.
VocabObjectiveResult run_chunks(const at::Tensor& hidden, const at::Tensor& teacher,
                                const at::Tensor& teacher_index, const at::Tensor& labels,
                                const at::Tensor& weights, const at::Tensor& lm_head,
                                const VocabObjectiveOptions& options, at::Tensor* grad_hidden) {
  const int64_t rows = hidden.size(0), k = options.top_k;
  const bool supervised = teacher.defined();
  const auto f32 = hidden.options().dtype(at::kFloat);
  VocabObjectiveResult out;
  if (supervised) {
    out.ce = at::empty({rows}, f32);
    out.l1 = at::empty({rows}, f32);
    out.argmax = at::empty({rows}, labels.options());
    out.candidates = at::empty({rows, k}, labels.options());
    out.teacher_candidates = at::empty({rows, k}, f32);
  }
  if (grad_hidden != nullptr) *grad_hidden = at::empty(hidden.sizes(), hidden.options());
  VocabRowGradient gradient;
  gradient.ce_weight = options.ce_weight;
  gradient.l1_weight = 1.0 - options.ce_weight;
  const auto head_t = lm_head.t();
  std::optional<VocabPolicyChunks> policy;
  int64_t step = chunk_rows(options, lm_head, supervised ? 2 : 1);
  if (options.policy != nullptr) {
    policy.emplace(*options.policy);
    step = policy_chunk_rows(step, options.policy->targets.size(2));
  }
  const ChunkTeachers shared = teacher_index.defined()
                                   ? chunk_teachers(teacher_index, teacher.size(0), step)
                                   : ChunkTeachers{};
  for (int64_t begin = 0; begin < rows; begin += step) {
    const int64_t end = std::min(rows, begin + step);
    auto z = at::mm(hidden.slice(0, begin, end), head_t);
    if (!supervised) {  // the policy alone: its gradient over z
      policy->chunk(z, begin / options.policy->targets.size(2),
                    grad_hidden != nullptr ? z : at::Tensor());
      if (grad_hidden != nullptr) {
        auto rows_grad = grad_hidden->slice(0, begin, end);
        at::mm_out(rows_grad, z, lm_head);
      }
      continue;
    }
    // The policy's gradient either joins the row kernel's own (logits scale 1: one rounding, no
    // second pass over the logits) or goes aside first, since the row pass overwrites z.
    at::Tensor policy_grad;
    const bool use_kernel = options.use_kernel && vocab_kernel_takes(z);
    if (policy) {
      const int64_t first_block = begin / options.policy->targets.size(2);
      if (grad_hidden != nullptr && use_kernel && policy->folds_into_row_pass()) {
        const auto folded = policy->chunk_coefficients(z, first_block);
        gradient.policy_total = folded.total;
        gradient.policy_targets = folded.targets;
        gradient.policy_coefficients = folded.coefficients;
      } else {
        if (grad_hidden != nullptr) policy_grad = at::empty_like(z);
        policy->chunk(z, first_block, policy_grad);
      }
    }
    at::Tensor t, teacher_rows;
    if (teacher_index.defined()) {
      const int64_t c = begin / step;
      const auto positions = shared.positions.slice(0, shared.offsets[c], shared.offsets[c + 1]);
      t = at::mm(teacher.index_select(0, positions), head_t);
      teacher_rows = shared.local.slice(0, begin, end);
    } else {
      t = at::mm(teacher.slice(0, begin, end), head_t);
    }
    const auto y = labels.slice(0, begin, end);
    gradient.weights = weights.slice(0, begin, end);
    auto r = vocab_rows(z, t, y, grad_hidden != nullptr ? &gradient : nullptr, use_kernel, k,
                        teacher_rows);
    out.ce.slice(0, begin, end).copy_(r.ce);
    out.l1.slice(0, begin, end).copy_(r.l1);
    out.argmax.slice(0, begin, end).copy_(r.argmax);
    if (k > 0) {
      out.candidates.slice(0, begin, end).copy_(r.candidates);
      out.teacher_candidates.slice(0, begin, end).copy_(r.teacher_candidates);
    }
    if (grad_hidden != nullptr) {
      if (policy_grad.defined()) z.add_(policy_grad);
      auto rows_grad = grad_hidden->slice(0, begin, end);
      at::mm_out(rows_grad, z, lm_head);
    }
  }
  out.loss =
      supervised
          ? (weights * (options.ce_weight * out.ce + (1.0 - options.ce_weight) * out.l1)).sum()
          : at::zeros({}, f32);
  if (policy) {
    out.loss = out.loss + policy->scaled_loss();
    out.policy = policy->result();
  }
  return out;
}

// dX, kept by forward, scaled by the incoming gradient of the loss. In place (no second [rows, H]
// copy), by a host scalar so that the scale is applied in fp32, not rounded to a bf16 tensor first
// (one synchronisation per backward).
at::Tensor scaled_grad_hidden(AutogradContext* ctx, const at::Tensor& grad_loss) {
  auto grad_hidden = ctx->saved_data["grad_hidden"].toTensor();
  ctx->saved_data.erase("grad_hidden");  // dX is used once: free it with this backward
  return grad_hidden.mul_(grad_loss.item<double>());
}

// Forward = the chunked objective with its gradient; backward = grad_output · dX.
struct VocabObjectiveFunction : torch::autograd::Function<VocabObjectiveFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden,
                               const at::Tensor& teacher,
                               const std::optional<at::Tensor>& teacher_index,
                               const at::Tensor& labels, const at::Tensor& weights,
                               const at::Tensor& lm_head, double ce_weight, int64_t top_k,
                               int64_t chunk, bool use_kernel, const VocabPolicy* policy,
                               VocabPolicyResult* policy_out) {
    const VocabObjectiveOptions options{ce_weight, top_k, chunk, use_kernel, policy};
    at::Tensor grad_hidden;
    auto r = run_chunks(hidden, teacher, teacher_index.value_or(at::Tensor()), labels, weights,
                        lm_head, options, &grad_hidden);
    ctx->saved_data["grad_hidden"] = grad_hidden;
    ctx->mark_non_differentiable({r.ce, r.l1, r.argmax, r.candidates, r.teacher_candidates});
    *policy_out = r.policy;
    return {r.loss, r.ce, r.l1, r.argmax, r.candidates, r.teacher_candidates};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    variable_list grads(12);
    grads[0] = scaled_grad_hidden(ctx, grad_outputs[0]);
    return grads;
  }
};

// The policy term alone, the same way.
struct VocabPolicyFunction : torch::autograd::Function<VocabPolicyFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& lm_head, int64_t chunk, bool use_kernel,
                            const VocabPolicy* policy, VocabPolicyResult* policy_out) {
    VocabObjectiveOptions options;
    options.chunk_rows = chunk;
    options.use_kernel = use_kernel;
    options.policy = policy;
    at::Tensor grad_hidden;
    auto r = run_chunks(hidden, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), lm_head,
                        options, &grad_hidden);
    ctx->saved_data["grad_hidden"] = grad_hidden;
    *policy_out = r.policy;
    return r.loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    variable_list grads(6);
    grads[0] = scaled_grad_hidden(ctx, grad_outputs[0]);
    return grads;
  }
};

}  // namespace

int64_t vocab_teacher_rows(const at::Tensor& teacher_index, int64_t positions,
                           int64_t chunk_rows) {
  return chunk_teachers(teacher_index, positions, chunk_rows).offsets.back();
}

int64_t vocab_chunk_rows(int64_t vocab, int64_t element_bytes, int64_t logits_per_row) {
  constexpr int64_t kTileRows = 256;
  const int64_t rows =
      std::max<int64_t>(1, kVocabChunkBytes / (vocab * element_bytes * logits_per_row));
  return rows >= kTileRows ? rows / kTileRows * kTileRows : rows;
}

VocabObjectiveResult vocab_objective(const at::Tensor& hidden, const at::Tensor& teacher_hidden,
                                     const at::Tensor& labels, const at::Tensor& weights,
                                     const at::Tensor& lm_head,
                                     const VocabObjectiveOptions& options,
                                     const at::Tensor& teacher_index) {
  check_rows(hidden, labels, lm_head, options);
  check_teacher(hidden, teacher_hidden, teacher_index, weights);
  if (options.policy != nullptr)
    check_vocab_policy(*options.policy, hidden.size(0), lm_head.size(0));
  const auto teacher = teacher_hidden.detach();
  const auto y = labels.contiguous();
  if (!at::GradMode::is_enabled() || !hidden.requires_grad()) {
    return run_chunks(hidden, teacher, teacher_index, y, weights, lm_head, options, nullptr);
  }
  // An optional, so that no index is no input (autograd takes no undefined tensor).
  const auto index = teacher_index.defined() ? std::optional<at::Tensor>(teacher_index)
                                             : std::nullopt;
  VocabPolicyResult policy;
  auto out = VocabObjectiveFunction::apply(hidden, teacher, index, y, weights.detach(),
                                           lm_head.detach(), options.ce_weight, options.top_k,
                                           options.chunk_rows, options.use_kernel,
                                           options.policy, &policy);
  return {out[0], out[1], out[2], out[3], out[4], out[5], policy};
}

VocabObjectiveResult vocab_policy_objective(const at::Tensor& hidden, const at::Tensor& lm_head,
                                            const VocabObjectiveOptions& options) {
  if (options.policy == nullptr) fail("vocab policy objective: no policy given");
  check_hidden(hidden, lm_head, options);
  check_vocab_policy(*options.policy, hidden.size(0), lm_head.size(0));
  if (!at::GradMode::is_enabled() || !hidden.requires_grad()) {
    return run_chunks(hidden, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), lm_head,
                      options, nullptr);
  }
  VocabObjectiveResult out;
  out.loss = VocabPolicyFunction::apply(hidden, lm_head.detach(), options.chunk_rows,
                                        options.use_kernel, options.policy, &out.policy);
  return out;
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
