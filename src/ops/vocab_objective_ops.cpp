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

// An index per row of hidden whose entries must lie in [0, end). Its entries outside are counted
// on the device and read with the objective's first read of the GPU (the chunks' teacher
// positions), so that checking costs no synchronisation of its own; an entry outside is then
// named with its row (`entry` at row r).
struct RowIndexCheck {
  at::Tensor index;
  int64_t end = 0;
  const char* entry = "";
  at::Tensor outside;  // int64 scalar: the entries outside [0, end)
};

// Checks the index's shape and starts counting its entries outside [0, end) (`name`: int64
// [rows] on hidden's device).
RowIndexCheck row_index_check(const at::Tensor& index, const at::Tensor& hidden, int64_t end,
                              const char* name, const char* entry) {
  if (index.dim() != 1 || index.size(0) != hidden.size(0) || index.scalar_type() != at::kLong ||
      index.device() != hidden.device()) {
    fail("vocab objective: {} must be int64 [{}] on {}, got {} {} on {}", name, hidden.size(0),
         hidden.device().str(), c10::toString(index.scalar_type()), c10::str(index.sizes()),
         index.device().str());
  }
  return {index, end, entry, ((index < 0) | (index >= end)).sum()};
}

// Reads `values` (1-D int64) to the host together with the checks' counts, in one
// synchronisation, and fails naming the first entry outside its range; returns the values.
at::Tensor read_checked(std::vector<at::Tensor> values, const std::vector<RowIndexCheck>& checks) {
  int64_t read = 0;
  for (const auto& v : values) read += v.numel();
  for (const auto& c : checks) values.push_back(c.outside.reshape({1}));
  if (values.empty()) return at::Tensor();
  const auto host = at::cat(values).cpu();
  const int64_t* outside = host.data_ptr<int64_t>() + read;
  for (size_t i = 0; i < checks.size(); ++i) {
    if (outside[i] == 0) continue;
    const auto& c = checks[i];
    const int64_t row = ((c.index < 0) | (c.index >= c.end)).nonzero()[0][0].item<int64_t>();
    fail("vocab objective: {} {} at row {} is outside [0, {})", c.entry,
         c.index[row].item<int64_t>(), row, c.end);
  }
  return host.slice(0, 0, read);
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

RowIndexCheck check_rows(const at::Tensor& hidden, const at::Tensor& labels,
                         const at::Tensor& lm_head, const VocabObjectiveOptions& options) {
  check_hidden(hidden, lm_head, options);
  return row_index_check(labels, hidden, lm_head.size(0), "labels", "label");
}

// The teacher's shape and weights; with an index, its range check (appended to `checks`).
void check_teacher(const at::Tensor& hidden, const at::Tensor& teacher, const at::Tensor& index,
                   const at::Tensor& weights, std::vector<RowIndexCheck>& checks) {
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
    checks.push_back(
        row_index_check(index, hidden, teacher.size(0), "teacher_index", "teacher_index"));
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

// `index` must lie in [0, positions): the checks (its own among them) are read together with
// the chunks' sizes, in the one synchronisation this needs.
ChunkTeachers chunk_teachers(const at::Tensor& index, int64_t positions, int64_t step,
                             const std::vector<RowIndexCheck>& checks = {}) {
  const int64_t rows = index.size(0), chunks = (rows + step - 1) / step;
  const auto chunk = at::arange(rows, index.options()).div(step, "floor");
  // Keys order by chunk, then position, so one sort finds every chunk's distinct positions:
  // each sorted key's rank among the distinct keys is the prefix count of first occurrences. An
  // entry outside [0, positions) is clamped here, so that nothing indexes out of bounds before
  // its check fails below.
  const auto [sorted, order] = (chunk * positions + index.clamp(0, positions - 1)).sort();
  auto first = at::ones({rows}, index.options().dtype(at::kBool));
  if (rows > 1) first.slice(0, 1).copy_(sorted.slice(0, 1).ne(sorted.slice(0, 0, -1)));
  const auto rank = first.cumsum(0) - 1;
  const auto per_chunk = at::zeros({chunks}, index.options())
                             .index_add_(0, sorted.div(positions, "floor"), first.to(at::kLong));
  const auto sizes = read_checked({per_chunk}, checks);  // the one synchronisation
  const auto size = sizes.accessor<int64_t, 1>();
  ChunkTeachers out;
  out.offsets.assign(1, 0);
  for (int64_t c = 0; c < chunks; ++c) out.offsets.push_back(out.offsets.back() + size[c]);
  // Equal keys share a rank, so scattering every sorted key writes each distinct key once over.
  const auto keys = at::empty({out.offsets.back()}, sorted.options()).scatter_(0, rank, sorted);
  out.positions = keys - keys.div(positions, "floor") * positions;
  const auto inverse = at::empty_like(rank).scatter_(0, order, rank);
  out.local = inverse - (per_chunk.cumsum(0) - per_chunk).index_select(0, chunk);
  return out;
}

// Rows per chunk: the logits budget (draft and teacher logits with a teacher), fewer with a
// policy.
int64_t objective_step(const VocabObjectiveOptions& options, const at::Tensor& lm_head,
                       bool supervised) {
  const int64_t step = chunk_rows(options, lm_head, supervised ? 2 : 1);
  return options.policy != nullptr ? policy_chunk_rows(step, options.policy->targets.size(2))
                                   : step;
}

// The whole objective, chunk by chunk (objective_step rows each); with grad_hidden, also
// dX = Σ_chunks g @ lm_head. Without a teacher, the policy term alone. `shared`: the teacher
// states by position (chunk_teachers), else one teacher row per row.
VocabObjectiveResult run_chunks(const at::Tensor& hidden, const at::Tensor& teacher,
                                const ChunkTeachers* shared, const at::Tensor& labels,
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
  if (options.policy != nullptr) policy.emplace(*options.policy);
  const int64_t step = objective_step(options, lm_head, supervised);
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
    if (shared != nullptr) {
      const int64_t c = begin / step;
      const auto positions = shared->positions.slice(0, shared->offsets[c], shared->offsets[c + 1]);
      t = at::mm(teacher.index_select(0, positions), head_t);
      teacher_rows = shared->local.slice(0, begin, end);
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

// dX, kept by forward, scaled by the incoming gradient of the loss in fp32 (not rounded to dX's
// dtype first), then rounded once into dX. The scale stays on the device: reading it would make
// the host wait for the GPU in the middle of the backward (docs/model.md, "The host stays
// ahead"); the price is an fp32 copy of dX for the product.
at::Tensor scaled_grad_hidden(AutogradContext* ctx, const at::Tensor& grad_loss) {
  auto grad_hidden = ctx->saved_data["grad_hidden"].toTensor();
  ctx->saved_data.erase("grad_hidden");  // dX is used once: free it with this backward
  const auto type = grad_hidden.scalar_type();
  if (type == at::kFloat || type == at::kDouble) {
    return grad_hidden.mul_(grad_loss.to(grad_hidden.device(), type));
  }
  const auto scale = grad_loss.to(grad_hidden.device(), at::kFloat);
  return grad_hidden.copy_(grad_hidden.to(at::kFloat).mul_(scale));
}

// Forward = the chunked objective with its gradient; backward = grad_output · dX.
struct VocabObjectiveFunction : torch::autograd::Function<VocabObjectiveFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden,
                               const at::Tensor& teacher, const ChunkTeachers* shared,
                               const at::Tensor& labels, const at::Tensor& weights,
                               const at::Tensor& lm_head, double ce_weight, int64_t top_k,
                               int64_t chunk, bool use_kernel, const VocabPolicy* policy,
                               VocabPolicyResult* policy_out) {
    const VocabObjectiveOptions options{ce_weight, top_k, chunk, use_kernel, policy};
    at::Tensor grad_hidden;
    auto r = run_chunks(hidden, teacher, shared, labels, weights, lm_head, options, &grad_hidden);
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
    auto r = run_chunks(hidden, at::Tensor(), nullptr, at::Tensor(), at::Tensor(), lm_head, options,
                        &grad_hidden);
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
  std::vector<RowIndexCheck> checks{check_rows(hidden, labels, lm_head, options)};
  check_teacher(hidden, teacher_hidden, teacher_index, weights, checks);
  if (options.policy != nullptr)
    check_vocab_policy(*options.policy, hidden.size(0), lm_head.size(0));
  const auto teacher = teacher_hidden.detach();
  const auto y = labels.contiguous();
  // The index checks are read with the chunks' teacher positions (or alone without them).
  std::optional<ChunkTeachers> shared;
  if (teacher_index.defined()) {
    shared = chunk_teachers(teacher_index, teacher.size(0), objective_step(options, lm_head, true),
                            checks);
  } else {
    read_checked({}, checks);
  }
  const ChunkTeachers* by_position = shared ? &*shared : nullptr;
  if (!at::GradMode::is_enabled() || !hidden.requires_grad()) {
    return run_chunks(hidden, teacher, by_position, y, weights, lm_head, options, nullptr);
  }
  VocabPolicyResult policy;
  auto out = VocabObjectiveFunction::apply(
      hidden, teacher, by_position, y, weights.detach(), lm_head.detach(), options.ce_weight,
      options.top_k, options.chunk_rows, options.use_kernel, options.policy, &policy);
  return {out[0], out[1], out[2], out[3], out[4], out[5], policy};
}

VocabObjectiveResult vocab_policy_objective(const at::Tensor& hidden, const at::Tensor& lm_head,
                                            const VocabObjectiveOptions& options) {
  if (options.policy == nullptr) fail("vocab policy objective: no policy given");
  check_hidden(hidden, lm_head, options);
  check_vocab_policy(*options.policy, hidden.size(0), lm_head.size(0));
  if (!at::GradMode::is_enabled() || !hidden.requires_grad()) {
    return run_chunks(hidden, at::Tensor(), nullptr, at::Tensor(), at::Tensor(), lm_head, options,
                      nullptr);
  }
  VocabObjectiveResult out;
  out.loss = VocabPolicyFunction::apply(hidden, lm_head.detach(), options.chunk_rows,
                                        options.use_kernel, options.policy, &out.policy);
  return out;
}

VocabCeResult vocab_ce(const at::Tensor& hidden, const at::Tensor& labels,
                       const at::Tensor& lm_head, const VocabObjectiveOptions& options) {
  read_checked({}, {check_rows(hidden, labels, lm_head, options)});
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
