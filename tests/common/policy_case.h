// A GSPO policy term in the block layout of the vocabulary row pass (ops/vocab_policy.h) and the
// same samples in the shared-row layout of the separate seam (objectives/gspo_policy_loss.h), for
// the parity tests of the row pass against the reference.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "dist/communicator.h"
#include "objectives/gspo_policy_loss.h"
#include "ops/vocab_objective_ops.h"
#include "ops/vocab_policy.h"

namespace dspine::testing {

// M blocks of T slots, G samples each. Samples 0 and 1 draw the same tokens (a token twice in one
// row); block 0's last slot and all of block 2 (a dropped anchor) are masked.
inline ops::VocabPolicy policy_case(int64_t blocks, int64_t slots, int64_t group, int64_t vocab,
                                    const torch::Device& device) {
  torch::manual_seed(11);
  ops::VocabPolicy p;
  p.targets = torch::randint(0, vocab, {blocks, group, slots}, torch::kInt64);
  p.targets.select(1, 1).copy_(p.targets.select(1, 0));
  auto masked = torch::zeros({blocks, slots}, torch::kBool);
  masked[0][slots - 1] = true;
  if (blocks > 2) masked[2].fill_(true);
  p.targets.masked_fill_(masked.unsqueeze(1), -100);
  p.old_logprobs = -torch::rand({blocks, group, slots}) * 3 - 0.5;
  p.advantages = torch::randn({blocks, group});
  p.label_counts = (~masked).sum(1);
  for (auto* t : {&p.targets, &p.old_logprobs, &p.advantages, &p.label_counts}) {
    *t = t->to(device).contiguous();
  }
  p.logits_scale = 1.3;
  p.eps_low = 0.2;
  p.eps_high = 0.28;
  p.divisor = 7.0;
  return p;
}

// The same samples as rows (block, slot) with G samples each, segment (block, sample).
inline objectives::GspoPolicySamples shared_rows(const ops::VocabPolicy& p) {
  const int64_t blocks = p.targets.size(0), group = p.targets.size(1), slots = p.targets.size(2);
  const int64_t rows = blocks * slots;
  auto per_row = [&](const torch::Tensor& t) {
    return t.permute({0, 2, 1}).reshape({rows, group});
  };
  auto spread = [&](const torch::Tensor& t) {  // [M, G] or [M, 1] → [M, G, T]
    return t.unsqueeze(2).expand({blocks, group, slots});
  };
  const auto options = p.targets.options();
  objectives::GspoPolicySamples s;
  s.targets = per_row(p.targets);
  s.old_logprobs = per_row(p.old_logprobs);
  s.advantages = per_row(spread(p.advantages));
  s.segments = per_row(spread(torch::arange(blocks * group, options).view({blocks, group})));
  s.label_counts = per_row(spread(p.label_counts.view({blocks, 1}).expand({blocks, group})));
  s.seam_order = torch::arange(rows * group, options)
                     .view({blocks, slots, group})
                     .permute({0, 2, 1})
                     .reshape(-1);
  s.num_segments = blocks * group;
  return s;
}

inline objectives::GspoSeamParams seam_params(const ops::VocabPolicy& p) {
  objectives::GspoSeamParams params;
  params.logits_scale = p.logits_scale;
  params.eps_low = p.eps_low;
  params.eps_high = p.eps_high;
  params.divisor = p.divisor;
  return params;
}

// One side of a parity check: the loss, the policy's metrics, its log-probs [M, G, T] and the
// gradient in the hidden states (fp32).
struct PolicySide {
  double loss, clipped_fraction, ratio_mean, new_logprobs;
  torch::Tensor logprobs, grad;
};

// The policy alone, ρ = 1: the vocabulary row pass in chunks of `chunk_rows` rows (with its
// back end, policy.backend) against projecting every logit and the separate seam (`reference`).
inline std::pair<PolicySide, PolicySide> policy_alone(const ops::VocabPolicy& policy,
                                                      const torch::Tensor& hidden,
                                                      const torch::Tensor& lm_head,
                                                      int64_t chunk_rows,
                                                      objectives::GspoBackend reference) {
  const int64_t blocks = policy.targets.size(0), group = policy.targets.size(1),
                slots = policy.targets.size(2);
  PolicySide row, ref;
  {
    auto h = hidden.detach().clone().requires_grad_();
    ops::VocabObjectiveOptions options;
    options.chunk_rows = chunk_rows;
    options.policy = &policy;
    auto out = ops::vocab_policy_objective(h, lm_head, options);
    out.loss.backward();
    row = {out.loss.item<double>(),
           out.policy.clipped_fraction.item<double>(),
           out.policy.ratio_mean.item<double>(),
           out.policy.new_logprobs.item<double>(),
           out.policy.logprobs,
           h.grad().to(torch::kFloat32)};
  }
  {
    auto comm = dist::make_single_process_communicator();
    auto h = hidden.detach().clone().requires_grad_();
    auto logits = h.mm(lm_head.t());
    auto out = objectives::gspo_policy_loss(logits, shared_rows(policy), seam_params(policy), *comm,
                                            reference);
    out.loss.backward();
    ref = {out.loss.item<double>(),
           out.seam.clipped_fraction.item<double>(),
           out.seam.ratio_mean.item<double>(),
           out.seam.new_logprobs.item<double>(),
           out.logprobs.view({blocks, slots, group}).permute({0, 2, 1}),
           h.grad().to(torch::kFloat32)};
  }
  return {row, ref};
}

}  // namespace dspine::testing
