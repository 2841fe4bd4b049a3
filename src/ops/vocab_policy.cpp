#include "ops/vocab_policy.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "core/error.h"
#include "dist/communicator.h"
#include "ops/gspo_ops.h"

namespace dspine::ops {
namespace {

// ATen rows per chunk: about 256 MiB of fp32 logits.
constexpr int64_t kReferenceChunkBytes = int64_t(256) << 20;

int64_t reference_rows(int64_t vocab) {
  return std::max<int64_t>(1, kReferenceChunkBytes / (4 * std::max<int64_t>(vocab, 1)));
}

void check_tensor(const at::Tensor& t, const char* name, at::IntArrayRef sizes,
                  at::ScalarType type) {
  if (!t.defined() || t.sizes() != sizes || t.scalar_type() != type) {
    fail("vocab policy: {} must be {} {}, got {}", name, c10::toString(type), c10::str(sizes),
         t.defined() ? c10::toString(t.scalar_type()) + std::string(" ") + c10::str(t.sizes())
                     : std::string("none"));
  }
}

}  // namespace

void check_vocab_policy(const VocabPolicy& p, int64_t rows, int64_t vocab) {
  if (!p.targets.defined() || p.targets.dim() != 3)
    fail("vocab policy: targets must be [M, G, T], got {}",
         p.targets.defined() ? c10::str(p.targets.sizes()) : "none");
  const int64_t blocks = p.targets.size(0), group = p.targets.size(1), slots = p.targets.size(2);
  if (blocks * slots != rows)
    fail("vocab policy: {} blocks of {} slots do not cover the {} hidden rows", blocks, slots,
         rows);
  check_tensor(p.targets, "targets", {blocks, group, slots}, at::kLong);
  check_tensor(p.old_logprobs, "old_logprobs", {blocks, group, slots}, at::kFloat);
  check_tensor(p.advantages, "advantages", {blocks, group}, at::kFloat);
  check_tensor(p.label_counts, "label_counts", {blocks}, at::kLong);
  if (p.targets.ge(vocab).any().item<bool>())
    fail("vocab policy: a target id is outside the vocabulary of {}", vocab);
  if (!(p.divisor > 0)) fail("vocab policy: divisor must be > 0, got {}", p.divisor);
  if (!(p.logits_scale > 0)) fail("vocab policy: logits_scale must be > 0, got {}", p.logits_scale);
}

int64_t policy_chunk_rows(int64_t chunk_rows, int64_t block_size) {
  return std::max<int64_t>(1, chunk_rows / block_size) * block_size;
}

at::Tensor policy_row_logsumexp(const at::Tensor& z, const at::Tensor& first_targets,
                                double logits_scale, bool fused) {
  if (fused) {
    GspoFusedSeam status(z.size(0), 1, z.device());
    at::Tensor logprobs, lse;
    gspo_vocab_forward(z, first_targets, logits_scale, status, logprobs, lse);
    return lse;
  }
  const int64_t rows = z.size(0), chunk = reference_rows(z.size(1));
  auto lse = at::empty({rows}, z.options().dtype(at::kFloat));
  for (int64_t begin = 0; begin < rows; begin += chunk) {
    const int64_t n = std::min(chunk, rows - begin);
    lse.narrow(0, begin, n)
        .copy_((z.narrow(0, begin, n).to(at::kFloat) * logits_scale).logsumexp(1));
  }
  return lse;
}

void write_policy_gradient(const at::Tensor& z, const at::Tensor& targets, const at::Tensor& lse,
                           const at::Tensor& coefficient, const at::Tensor& logprobs,
                           double logits_scale, bool fused, const at::Tensor& grad) {
  const auto labelled = targets.select(1, 0).ge(0);
  const auto total = coefficient.sum(1);  // C_r
  if (fused) {
    at::Tensor out = grad;
    gspo_vocab_backward(z, targets.select(1, 0).contiguous(), lse, total.contiguous(), logits_scale,
                        out, /*accumulate=*/false);
  } else {
    const int64_t rows = z.size(0), chunk = reference_rows(z.size(1));
    for (int64_t begin = 0; begin < rows; begin += chunk) {
      const int64_t n = std::min(chunk, rows - begin);
      auto p = (z.narrow(0, begin, n).to(at::kFloat) * logits_scale -
                lse.narrow(0, begin, n).unsqueeze(1))
                   .exp();
      grad.narrow(0, begin, n)
          .copy_(at::where(labelled.narrow(0, begin, n).unsqueeze(1),
                           p * total.narrow(0, begin, n).unsqueeze(1), at::zeros({}, p.options())));
    }
  }
  const auto same = targets.unsqueeze(2).eq(targets.unsqueeze(1));  // [n, G, G]
  const auto label_value =
      total.unsqueeze(1) * logprobs.exp() - (same.to(at::kFloat) * coefficient.unsqueeze(1)).sum(2);
  // Masked rows are zero; writing 0 into their column 0 keeps them so. A token drawn twice in a
  // row is written twice with the same value.
  const auto value =
      at::where(labelled.unsqueeze(1), label_value, at::zeros({}, label_value.options()));
  at::Tensor out = grad;
  out.scatter_(1, targets.clamp_min(0), value.to(grad.scalar_type()));
}

VocabPolicyChunks::VocabPolicyChunks(const VocabPolicy& policy)
    : policy_(policy), group_(policy.targets.size(1)), slots_(policy.targets.size(2)) {
  const auto blocks = policy.targets.size(0);
  const auto f32 = policy.old_logprobs.options();
  result_.logprobs = at::zeros({blocks, group_, slots_}, f32);
  result_.loss = at::zeros({}, f32);
  result_.new_logprobs = at::zeros({}, f32);
  result_.clipped_fraction = at::zeros({}, f32);
  result_.ratio_mean = at::zeros({}, f32);
}

at::Tensor VocabPolicyChunks::scaled_loss() const { return result_.loss * policy_.loss_scale; }

VocabPolicyChunks::ChunkRows VocabPolicyChunks::seam_chunk(const at::Tensor& z, int64_t first_block,
                                                           bool gradient) {
  const int64_t blocks = z.size(0) / slots_, rows = z.size(0);
  if (blocks * slots_ != rows) fail("vocab policy: a chunk of {} rows splits a block", rows);
  const bool fused = gspo_fused_backend(policy_.backend, z);
  const double scale = policy_.logits_scale;
  // Token order [c, G, T]: each segment (block, sample) is one contiguous run of T slots.
  const auto targets = policy_.targets.narrow(0, first_block, blocks);
  const auto row_targets = targets.permute({0, 2, 1}).reshape({rows, group_});  // [(c, T), G]
  const auto mask = row_targets.ge(0);
  const auto lse = policy_row_logsumexp(z, row_targets.select(1, 0).contiguous(), scale, fused);
  auto row_logprobs =
      z.gather(1, row_targets.clamp_min(0)).to(at::kFloat) * scale - lse.unsqueeze(1);
  row_logprobs = at::where(mask, row_logprobs, at::zeros({}, row_logprobs.options()));
  const auto logprobs = row_logprobs.view({blocks, slots_, group_}).permute({0, 2, 1});
  result_.logprobs.narrow(0, first_block, blocks).copy_(logprobs);

  const auto tokens_of = [&](const at::Tensor& t) { return t.reshape({-1}); };
  GspoTokens tokens;
  tokens.target = tokens_of(targets);
  tokens.old_logprobs = tokens_of(policy_.old_logprobs.narrow(0, first_block, blocks));
  tokens.advantages = tokens_of(policy_.advantages.narrow(0, first_block, blocks)
                                    .unsqueeze(2)
                                    .expand({blocks, group_, slots_}));
  tokens.segment =
      at::arange(blocks * group_ * slots_, tokens.target.options()).div(slots_, "floor");
  tokens.label_counts = tokens_of(policy_.label_counts.narrow(0, first_block, blocks)
                                      .view({blocks, 1, 1})
                                      .expand({blocks, group_, slots_}));
  GspoSeamParams params;
  params.num_segments = blocks * group_;
  params.logits_scale = scale;
  params.eps_low = policy_.eps_low;
  params.eps_high = policy_.eps_high;
  params.divisor = policy_.divisor;
  if (gradient) params.grad_output = policy_.loss_scale;
  params.validate = !z.is_cuda();  // the rollout made these inputs; checks would synchronise
  static const auto local = dist::make_single_process_communicator();  // no collective is issued
  const auto seam = gspo_segment_seam(tokens_of(logprobs.contiguous()), tokens, params, *local,
                                      fused ? GspoBackend::kFused : GspoBackend::kReference);
  result_.loss += seam.loss;
  result_.new_logprobs += seam.new_logprobs;
  result_.clipped_fraction += seam.clipped_fraction;
  result_.ratio_mean += seam.ratio_mean;
  ChunkRows out{row_targets, lse, row_logprobs, at::Tensor()};
  if (gradient) {
    out.coefficients =
        seam.coefficient.view({blocks, group_, slots_}).permute({0, 2, 1}).reshape({rows, group_});
  }
  return out;
}

void VocabPolicyChunks::chunk(const at::Tensor& z, int64_t first_block, const at::Tensor& grad) {
  const auto rows = seam_chunk(z, first_block, grad.defined());
  if (!grad.defined()) return;
  write_policy_gradient(z, rows.targets, rows.lse, rows.coefficients, rows.logprobs,
                        policy_.logits_scale, gspo_fused_backend(policy_.backend, z), grad);
}

VocabPolicyChunks::RowCoefficients VocabPolicyChunks::chunk_coefficients(const at::Tensor& z,
                                                                         int64_t first_block) {
  const auto rows = seam_chunk(z, first_block, true);
  const auto sampled = rows.targets.ge(0);
  RowCoefficients out;
  out.targets = rows.targets.contiguous();
  out.coefficients =
      at::where(sampled, rows.coefficients, at::zeros({}, rows.coefficients.options()));
  // A slot is masked in every sample or in none: masked rows get C = 0.
  out.total = out.coefficients.sum(1);
  return out;
}

}  // namespace dspine::ops
