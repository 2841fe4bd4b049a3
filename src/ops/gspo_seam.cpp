#include "ops/gspo_seam.h"

#include <algorithm>
#include <string>

#include <torch/torch.h>

#include "core/error.h"
#include "kernels/gspo_seam_kernels.h"
#include "ops/gspo_ops.h"

namespace dspine::ops {
namespace {

constexpr int64_t kReferenceChunkBytes = int64_t(256) << 20;

void check_present(const at::Tensor& t, const char* name, int64_t num_tokens,
                   const at::Device& device) {
  if (!t.defined()) fail("gspo seam: `{}` is missing", name);
  if (t.dim() != 1)
    fail("gspo seam: `{}` has shape {}; per-token inputs are 1-D [N] (flatten [B, T] first)",
         name, c10::str(t.sizes()));
  if (t.size(0) != num_tokens)
    fail("gspo seam: `{}` has {} elements but logprobs has {} (every per-token input is [N])",
         name, t.size(0), num_tokens);
  if (t.device() != device)
    fail("gspo seam: `{}` is on {} but logprobs is on {}", name, t.device().str(), device.str());
}

void check_dtype(const at::Tensor& t, const char* name, std::initializer_list<at::ScalarType> ok) {
  for (at::ScalarType type : ok)
    if (t.scalar_type() == type) return;
  std::string names;
  for (at::ScalarType type : ok)
    names += std::string(names.empty() ? "" : "/") + c10::toString(type);
  fail("gspo seam: `{}` has dtype {} but must be {}", name, c10::toString(t.scalar_type()), names);
}

// First index where `bad` is true, or −1.
int64_t first_true(const at::Tensor& bad) {
  const at::Tensor index = bad.nonzero();
  return index.size(0) > 0 ? index[0][0].item<int64_t>() : -1;
}

void check_finite(const at::Tensor& values, const at::Tensor& mask, const char* name) {
  if (!values.is_floating_point()) return;
  const int64_t t = first_true(mask & values.isfinite().logical_not());
  if (t >= 0)
    fail("gspo seam: `{}` is non-finite ({}) at labelled token {}", name,
         values[t].item<double>(), t);
}

}  // namespace

bool gspo_fused_backend(GspoBackend backend, const at::Tensor& on) {
  switch (backend) {
    case GspoBackend::kReference: return false;
    case GspoBackend::kFused:
      if (!on.is_cuda()) fail("gspo seam: the fused back end needs CUDA tensors, got {}", on.device().str());
      return true;
    case GspoBackend::kAuto: return on.is_cuda();
  }
  return false;
}

namespace {

// Reference seam: docs/gspo.md ("The seam") op by op, in fp32; masking by select so that non-finite
// values at masked positions never reach a sum.
GspoSeamResult seam_reference(const at::Tensor& logprobs, const GspoTokens& tokens,
                              const GspoSeamParams& params, dist::Communicator& comm) {
  const auto f32 = logprobs.options().dtype(at::kFloat);
  const at::Tensor zero = at::zeros({}, f32);
  const at::Tensor mask = tokens.target.ge(0);
  const at::Tensor weight = at::where(mask, tokens.label_counts.to(at::kFloat).clamp_min(1.0).reciprocal(), zero);
  const at::Tensor lp = at::where(mask, logprobs, zero);
  const at::Tensor old = at::where(mask, tokens.old_logprobs, zero);
  const at::Tensor advantage = at::where(mask, tokens.advantages, zero);
  const at::Tensor u = (lp - old) * weight;
  const at::Tensor v = advantage * weight;
  const at::Tensor segment = at::where(mask, tokens.segment.to(at::kLong), at::zeros({}, tokens.segment.options().dtype(at::kLong)));

  at::Tensor sums = at::zeros({2, params.num_segments}, f32);
  sums[0].index_add_(0, segment, u);
  sums[1].index_add_(0, segment, v);
  if (params.segments_span_ranks) comm.all_reduce(sums, dist::ReduceOp::kSum);

  const double low = 1.0 - params.eps_low, high = 1.0 + params.eps_high;
  const at::Tensor ratio = sums[0].exp();
  const at::Tensor mean_advantage = sums[1];
  const at::Tensor segment_loss =
      at::minimum(ratio * mean_advantage, ratio.clamp(low, high) * mean_advantage).neg();
  const at::Tensor segment_clipped = ratio.lt(low).logical_or(ratio.gt(high)).to(at::kFloat);

  GspoSeamResult result;
  result.segment_sums = sums;
  result.loss = at::where(mask, segment_loss.index_select(0, segment), zero).sum() / params.divisor;
  result.new_logprobs = (lp * weight).sum() / params.divisor;
  result.clipped_fraction = (weight * segment_clipped.index_select(0, segment)).sum() / params.divisor;
  result.ratio_mean = (weight * ratio.index_select(0, segment)).sum() / params.divisor;
  if (params.grad_output) {
    const at::Tensor segment_coefficient =
        (mean_advantage.clamp_min(0) * ratio.le(high) + mean_advantage.clamp_max(0) * ratio.ge(low)) * ratio;
    result.coefficient = at::where(mask, segment_coefficient.index_select(0, segment), zero) *
                         (*params.grad_output / params.divisor * params.logits_scale);
  }
  return result;
}

void raise_fused_status(int status, const GspoSeamParams& params) {
  if (status & kernels::kGspoBadTarget)
    fail("gspo vocab (fused): a labelled token's target id is outside [0, V)");
  if (status & kernels::kGspoBadSegment)
    fail("gspo seam (fused): a labelled token has a segment id outside [0, num_segments={})",
         params.num_segments);
  if (status & kernels::kGspoNonFinite)
    fail("gspo seam (fused): non-finite logprobs, old_logprobs, advantages or label_counts at a "
         "labelled token");
  if (status & kernels::kGspoSplitSegment)
    fail("gspo seam (fused): the labelled tokens of a segment are not one contiguous run "
         "(packed segments must be contiguous)");
}

GspoSeamArgs fused_args(const at::Tensor& logprobs, const GspoTokens& tokens,
                        const GspoSeamParams& params) {
  return GspoSeamArgs{logprobs.contiguous(),          tokens.target.contiguous(),
                      tokens.old_logprobs.contiguous(), tokens.advantages.contiguous(),
                      tokens.segment.contiguous(),    tokens.label_counts.contiguous(),
                      params.num_segments};
}

// The local seam, or reduce, the all-reduce hook and finish when segments span ranks; the seam
// is created by the caller so that the monolithic path's vocab forward reports bad targets
// through the same status().
GspoSeamResult seam_fused(GspoFusedSeam& seam, const GspoSeamArgs& args,
                          const GspoSeamParams& params, dist::Communicator& comm) {
  GspoFinishArgs scalars;
  scalars.eps_low = params.eps_low;
  scalars.eps_high = params.eps_high;
  scalars.divisor = params.divisor;
  at::Tensor coefficient;
  if (params.grad_output) {
    scalars.coefficient_scale = *params.grad_output / params.divisor * params.logits_scale;
    coefficient = at::empty_like(args.logprobs);
  }
  at::Tensor sums;
  at::Tensor out;
  if (params.segments_span_ranks) {
    seam.reduce(args);
    sums = seam.segment_sums();
    comm.all_reduce(sums, dist::ReduceOp::kSum);
    out = seam.finish(args, scalars, coefficient);
  } else {
    out = seam.local(args, scalars, coefficient);
    sums = seam.segment_sums();
  }
  if (params.validate) raise_fused_status(seam.status(), params);
  GspoSeamResult result;
  result.loss = out[0];
  result.new_logprobs = out[1];
  result.clipped_fraction = out[2];
  result.ratio_mean = out[3];
  result.coefficient = coefficient;
  result.segment_sums = sums;
  return result;
}

void check_logits(const at::Tensor& logits, const GspoTokens& tokens) {
  if (!logits.defined() || logits.dim() != 2)
    fail("gspo vocab: logits must be [N, V], got {}", logits.defined() ? c10::str(logits.sizes()) : "none");
  if (logits.scalar_type() != at::kBFloat16 && logits.scalar_type() != at::kFloat)
    fail("gspo vocab: logits dtype {} is not bf16 or fp32", c10::toString(logits.scalar_type()));
  if (!tokens.target.defined() || tokens.target.dim() != 1 || tokens.target.size(0) != logits.size(0))
    fail("gspo vocab: target must be [{}] to match logits {}", logits.size(0), c10::str(logits.sizes()));
}

void check_grad(const at::Tensor& logits, const at::Tensor& grad) {
  if (!grad.defined() || grad.sizes() != logits.sizes() || grad.scalar_type() != logits.scalar_type() ||
      grad.device() != logits.device())
    fail("gspo vocab: the logits gradient must be a {} {} tensor on {}", c10::str(logits.sizes()),
         c10::toString(logits.scalar_type()), logits.device().str());
}

GspoVocabResult vocab_reference(const at::Tensor& logits, const GspoTokens& tokens,
                                const GspoSeamParams& params, dist::Communicator& comm,
                                at::Tensor* grad_logits, bool accumulate, int64_t chunk_rows) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const int64_t chunk =
      chunk_rows > 0 ? chunk_rows : std::max<int64_t>(1, kReferenceChunkBytes / (4 * std::max<int64_t>(vocab, 1)));
  const auto f32 = logits.options().dtype(at::kFloat);
  const at::Tensor mask = tokens.target.ge(0);
  const at::Tensor label = tokens.target.clamp_min(0).unsqueeze(1);
  // Only one chunk of λ·float(z) exists at a time: rows are recomputed for the backward.
  auto scaled = [&](int64_t begin, int64_t n) {
    return logits.narrow(0, begin, n).to(at::kFloat) * params.logits_scale;
  };
  {  // gather needs in-range ids even without value checks
    const int64_t t = first_true(mask & tokens.target.ge(vocab));
    if (t >= 0)
      fail("gspo vocab: labelled token {} has target id {} outside [0, V={})", t,
           tokens.target[t].item<int64_t>(), vocab);
  }
  at::Tensor lp = at::empty({rows}, f32), lse = at::empty({rows}, f32);
  for (int64_t begin = 0; begin < rows; begin += chunk) {
    const int64_t n = std::min(chunk, rows - begin);
    const at::Tensor x = scaled(begin, n);
    const at::Tensor row_lse = x.logsumexp(1);
    lse.narrow(0, begin, n).copy_(row_lse);
    lp.narrow(0, begin, n).copy_(x.gather(1, label.narrow(0, begin, n)).squeeze(1) - row_lse);
  }
  GspoVocabResult result{gspo_segment_seam(lp, tokens, params, comm, GspoBackend::kReference), lp};
  if (grad_logits == nullptr || !params.grad_output) return result;
  const at::Tensor& c = result.seam.coefficient;
  for (int64_t begin = 0; begin < rows; begin += chunk) {
    const int64_t n = std::min(chunk, rows - begin);
    at::Tensor p = (scaled(begin, n) - lse.narrow(0, begin, n).unsqueeze(1)).exp();
    p.scatter_add_(1, label.narrow(0, begin, n), at::full({n, 1}, -1.0, f32));
    const at::Tensor row_mask = mask.narrow(0, begin, n).unsqueeze(1);
    const at::Tensor grad = at::where(row_mask, p * c.narrow(0, begin, n).unsqueeze(1), at::zeros({}, f32));
    at::Tensor out = grad_logits->narrow(0, begin, n);
    if (accumulate) {
      const at::Tensor previous = out.to(at::kFloat);
      out.copy_(at::where(row_mask, previous + grad, previous));
    } else {
      out.copy_(grad);
    }
  }
  return result;
}

GspoVocabResult vocab_fused(const at::Tensor& logits, const GspoTokens& tokens,
                            const GspoSeamParams& params, dist::Communicator& comm,
                            at::Tensor* grad_logits, bool accumulate) {
  GspoFusedSeam seam(logits.size(0), params.num_segments, logits.device());
  at::Tensor lp, lse;
  const at::Tensor target = tokens.target.contiguous();
  gspo_vocab_forward(logits, target, params.logits_scale, seam, lp, lse);
  validate_seam_shapes(lp, tokens, params);
  GspoVocabResult result{seam_fused(seam, fused_args(lp, tokens, params), params, comm), lp};
  if (grad_logits != nullptr && params.grad_output)
    gspo_vocab_backward(logits, target, lse, result.seam.coefficient, params.logits_scale,
                        *grad_logits, accumulate);
  return result;
}

}  // namespace

void validate_seam_shapes(const at::Tensor& logprobs, const GspoTokens& tokens,
                          const GspoSeamParams& params) {
  if (!logprobs.defined() || logprobs.dim() != 1)
    fail("gspo seam: logprobs must be [N], got {}", logprobs.defined() ? c10::str(logprobs.sizes()) : "none");
  const int64_t n = logprobs.size(0);
  const at::Device device = logprobs.device();
  check_present(tokens.target, "target", n, device);
  check_present(tokens.old_logprobs, "old_logprobs", n, device);
  check_present(tokens.advantages, "advantages", n, device);
  check_present(tokens.segment, "segment", n, device);
  check_present(tokens.label_counts, "label_counts", n, device);
  check_dtype(logprobs, "logprobs", {at::kFloat});
  check_dtype(tokens.target, "target", {at::kLong});
  check_dtype(tokens.old_logprobs, "old_logprobs", {at::kFloat});
  check_dtype(tokens.advantages, "advantages", {at::kFloat});
  check_dtype(tokens.segment, "segment", {at::kInt, at::kLong});
  check_dtype(tokens.label_counts, "label_counts", {at::kInt, at::kLong, at::kFloat});
  if (params.num_segments < 1) fail("gspo seam: num_segments must be >= 1, got {}", params.num_segments);
  if (!(params.divisor > 0)) fail("gspo seam: divisor D must be > 0, got {}", params.divisor);
}

void validate_seam_values(const at::Tensor& logprobs, const GspoTokens& tokens,
                          const GspoSeamParams& params) {
  const at::Tensor mask = tokens.target.ge(0);
  const at::Tensor bad_segment =
      mask & (tokens.segment.lt(0) | tokens.segment.ge(params.num_segments));
  const int64_t t = first_true(bad_segment);
  if (t >= 0)
    fail("gspo seam: labelled token {} has segment id {} outside [0, num_segments={})", t,
         tokens.segment[t].item<int64_t>(), params.num_segments);
  check_finite(logprobs, mask, "logprobs");
  check_finite(tokens.old_logprobs, mask, "old_logprobs");
  check_finite(tokens.advantages, mask, "advantages");
  check_finite(tokens.label_counts, mask, "label_counts");
}

GspoSeamResult gspo_segment_seam(const at::Tensor& logprobs, const GspoTokens& tokens,
                                 const GspoSeamParams& params, dist::Communicator& comm,
                                 GspoBackend backend) {
  validate_seam_shapes(logprobs, tokens, params);
  if (gspo_fused_backend(backend, logprobs)) {
    GspoFusedSeam seam(logprobs.size(0), params.num_segments, logprobs.device());
    return seam_fused(seam, fused_args(logprobs, tokens, params), params, comm);
  }
  if (params.validate) validate_seam_values(logprobs, tokens, params);
  return seam_reference(logprobs, tokens, params, comm);
}

GspoVocabResult gspo_vocab_seam(const at::Tensor& logits, const GspoTokens& tokens,
                                const GspoSeamParams& params, dist::Communicator& comm,
                                at::Tensor* grad_logits, bool accumulate, GspoBackend backend,
                                int64_t chunk_rows) {
  check_logits(logits, tokens);
  if (grad_logits != nullptr && params.grad_output) check_grad(logits, *grad_logits);
  if (gspo_fused_backend(backend, logits))
    return vocab_fused(logits, tokens, params, comm, grad_logits, accumulate);
  return vocab_reference(logits, tokens, params, comm, grad_logits, accumulate, chunk_rows);
}

}  // namespace dspine::ops
