#include "objectives/gspo_rollout.h"

#include <torch/torch.h>

#include <algorithm>
#include <string>

#include "core/error.h"
#include "objectives/dspine_terms.h"
#include "ops/logit_rows_ops.h"

namespace dspine::objectives {
namespace {

// The rows of a draft pass restricted to its kept blocks.
struct KeptRows {
  at::Tensor hidden, pre, predecessors;  // [K, T, ...]
};

KeptRows kept_rows(const DraftPass& pass, const at::Tensor& kept, bool need_pre) {
  KeptRows rows;
  rows.hidden = pass.hidden_rows.index_select(0, kept);
  rows.predecessors = pass.predecessors.index_select(0, kept);
  if (need_pre) {
    if (!pass.pre_rows.defined()) fail("gspo: refinement sampling needs a draft pass with full rows");
    rows.pre = pass.pre_rows.index_select(0, kept);
  }
  return rows;
}

// The uniforms of a chunk of c blocks, [c, T, G]; undefined: take the argmax (the greedy walk).
using Draws = at::Tensor;

// One index per uniform of `u` [R, G] from unnormalised row probabilities `probs` [R, C], or the
// argmax ([R, 1]) where `u` is undefined.
at::Tensor choose(const at::Tensor& probs, const at::Tensor& u) {
  return u.defined() ? ops::sample_categorical(probs, u) : probs.argmax(1, /*keepdim=*/true);
}

struct Walk {
  at::Tensor choices;       // [c, G, T]
  at::Tensor tokens;        // [c, G, T]
  at::Tensor logprobs;      // [c, G, T] under softmax(λ·z)
  at::Tensor probs;         // [c, G, T] under the sampling distribution
  at::Tensor candidates;    // [c, T, k] (refinement)
};

// Backbone: every slot from softmax(λ·z/τ) of its own logits; rows are the c·T slots. Sampling
// goes through the fused row kernel where the settings ask for it (no fp32 [c·T, V] copy).
Walk backbone_walk(const KeptRows& rows, const at::Tensor& lm_head, const GspoRolloutSettings& s,
                   int64_t group, const Draws& u) {
  const int64_t c = rows.hidden.size(0), t = rows.hidden.size(1);
  auto z = project_logits(rows.hidden, lm_head).view({c * t, -1});
  auto per_slot = [&](const at::Tensor& x) {  // [c·T, G] → [c, G, T]
    return x.view({c, t, -1}).permute({0, 2, 1}).contiguous();
  };
  Walk w;
  if (!u.defined()) {  // greedy: the argmax of softmax(λ·z/τ) is the argmax of z
    w.choices = per_slot(z.argmax(1, /*keepdim=*/true));
    w.tokens = w.choices;
    return w;
  }
  const auto draws = ops::sample_logit_rows(z, u.reshape({c * t, group}), s.logits_scale,
                                            s.temperature, s.fused_sampling);
  w.choices = per_slot(draws.choices);
  w.tokens = w.choices;
  w.logprobs = per_slot(draws.logprobs);
  w.probs = per_slot(draws.probs);
  return w;
}

// Refinement: slot by slot, refine(pre_t, previous token) scored against the backbone's top-k
// candidates of the slot; the previous token of slot 0 is the anchor token.
Walk refinement_walk(const KeptRows& rows, model::DSpineDraftImpl& draft, const at::Tensor& lm_head,
                     const GspoRolloutSettings& s, int64_t group, const Draws& u) {
  const int64_t c = rows.hidden.size(0), t = rows.hidden.size(1), h = rows.hidden.size(2);
  const int64_t k = std::min<int64_t>(s.top_k, lm_head.size(0));
  auto z = project_logits(rows.hidden, lm_head).to(torch::kFloat32);
  Walk w;
  w.candidates = std::get<1>(z.topk(k, -1));  // [c, T, k]
  std::vector<at::Tensor> choices, tokens, logprobs, probs;
  auto previous = rows.predecessors.select(1, 0).unsqueeze(1).expand({c, group});
  for (int64_t slot = 0; slot < t; ++slot) {
    auto pre = rows.pre.select(1, slot).unsqueeze(1).expand({c, group, h});
    auto refined = draft.refine(pre, previous);                                // [c, G, H]
    auto heads = lm_head.index_select(0, w.candidates.select(1, slot).reshape(-1))
                     .view({c, k, h});                                         // [c, k, H]
    auto scores = refined.matmul(heads.transpose(1, 2)).to(torch::kFloat32);  // [c, G, k]
    auto policy = torch::log_softmax(scores * s.logits_scale, -1);
    auto sampling = torch::softmax(scores * (s.logits_scale / s.temperature), -1);
    const auto slot_u = u.defined() ? u.select(1, slot).reshape({-1, 1}) : at::Tensor();
    auto choice = choose(sampling.view({c * group, k}), slot_u).view({c, group});
    auto token = w.candidates.select(1, slot).gather(1, choice);
    choices.push_back(choice);
    tokens.push_back(token);
    logprobs.push_back(policy.gather(2, choice.unsqueeze(2)).squeeze(2));
    probs.push_back(sampling.gather(2, choice.unsqueeze(2)).squeeze(2));
    previous = token;
  }
  w.choices = torch::stack(choices, 2);
  w.tokens = torch::stack(tokens, 2);
  w.logprobs = torch::stack(logprobs, 2);
  w.probs = torch::stack(probs, 2);
  return w;
}

// Runs the walk over chunks of kept blocks and concatenates the chunks.
Walk walk_blocks(const KeptRows& rows, model::DSpineDraftImpl& draft, const at::Tensor& lm_head,
                 const GspoRolloutSettings& s, int64_t group, const Draws& uniforms) {
  const int64_t blocks = rows.hidden.size(0);
  const int64_t chunk = s.chunk_blocks > 0 ? s.chunk_blocks : std::max<int64_t>(blocks, 1);
  std::vector<Walk> parts;
  for (int64_t begin = 0; begin < blocks; begin += chunk) {
    const int64_t n = std::min(chunk, blocks - begin);
    KeptRows part;
    part.hidden = rows.hidden.narrow(0, begin, n);
    part.predecessors = rows.predecessors.narrow(0, begin, n);
    if (rows.pre.defined()) part.pre = rows.pre.narrow(0, begin, n);
    const Draws u = uniforms.defined() ? uniforms.narrow(0, begin, n) : at::Tensor();
    parts.push_back(s.sampling == GspoSampling::kBackbone
                        ? backbone_walk(part, lm_head, s, group, u)
                        : refinement_walk(part, draft, lm_head, s, group, u));
  }
  auto cat = [&](at::Tensor Walk::*field) {
    std::vector<at::Tensor> items;
    for (const auto& part : parts) {
      if ((part.*field).defined()) items.push_back(part.*field);
    }
    return items.empty() ? at::Tensor() : torch::cat(items, 0);
  };
  Walk w;
  w.choices = cat(&Walk::choices);
  w.tokens = cat(&Walk::tokens);
  w.logprobs = cat(&Walk::logprobs);
  w.probs = cat(&Walk::probs);
  w.candidates = cat(&Walk::candidates);
  return w;
}

// Where flat index `flat` of tokens [K, G, T] was drawn, in the words of a batch.
std::string draw_site(const GspoRollout& rollout, int64_t flat) {
  const int64_t group = rollout.tokens.size(1), slots = rollout.tokens.size(2);
  const int64_t block = flat / (group * slots);
  const int64_t m = rollout.kept[block].item<int64_t>(), n = rollout.anchors.size(1);
  return fmt::format("batch row {}, anchor position {}, slot {}, sample {} of {}", m / n,
                     rollout.anchors[m / n][m % n].item<int64_t>(), flat % slots,
                     flat / slots % group, group);
}

}  // namespace

at::Tensor screen_draws(at::Tensor& tokens, at::Tensor& choices, int64_t vocab) {
  auto flat = tokens.reshape(-1);
  if (flat.numel() == 0) return at::zeros({kDrawCheckSize}, flat.options().dtype(at::kDouble));
  const auto undrawn = flat.eq(ops::kNoDraw);
  const auto outside = (flat.lt(0) | flat.ge(vocab)) & undrawn.logical_not();
  auto first = [](const at::Tensor& mask) { return mask.to(at::kInt).argmax().view({1}); };
  const auto first_outside = first(outside);
  auto check = at::cat({outside.sum().view({1}), first_outside, flat.index_select(0, first_outside),
                        undrawn.sum().view({1}), first(undrawn)})
                   .to(at::kDouble);
  const auto bad = (outside | undrawn).view_as(tokens);
  tokens.masked_fill_(bad, 0);
  if (choices.defined() && choices.sizes() == tokens.sizes()) choices.masked_fill_(bad, 0);
  return check;
}

std::optional<std::string> draw_fault(const GspoRollout& rollout, const double* check,
                                      int64_t vocab) {
  if (check[kDrawsOutside] == 0) return std::nullopt;
  return fmt::format("the rollout drew token id {} outside the vocabulary [0, {}) at {} ({} such "
                     "draws); nothing drawn reached the verifier or the policy term",
                     static_cast<int64_t>(check[kFirstOutsideValue]), vocab,
                     draw_site(rollout, static_cast<int64_t>(check[kFirstOutside])),
                     static_cast<int64_t>(check[kDrawsOutside]));
}

std::optional<std::string> undrawn_rows(const GspoRollout& rollout, const double* check) {
  if (check[kDrawsUndrawn] == 0) return std::nullopt;
  return fmt::format("the draft's logits hold NaN or +inf at {}: nothing to draw from ({} draws "
                     "left undrawn), so the update's loss is not finite",
                     draw_site(rollout, static_cast<int64_t>(check[kFirstUndrawn])),
                     static_cast<int64_t>(check[kDrawsUndrawn]));
}

at::Tensor accepted_prefix(const at::Tensor& tokens, const at::Tensor& target_tokens,
                           const at::Tensor& supervised) {
  auto matches = tokens.eq(target_tokens) & supervised.unsqueeze(1);
  return matches.to(torch::kInt64).cumprod(2).sum(2);
}

at::Tensor expected_acceptance(const at::Tensor& target_probs, const at::Tensor& draft_probs,
                               const at::Tensor& supervised) {
  auto step = torch::clamp_max(target_probs / draft_probs.clamp_min(1e-30), 1.0);
  step = step * supervised.unsqueeze(1).to(step.scalar_type());
  return step.cumprod(2).sum(2) / static_cast<double>(supervised.size(1));
}

at::Tensor group_advantages(const at::Tensor& rewards, GspoAdvantageNorm norm) {
  auto centred = rewards - rewards.mean(1, /*keepdim=*/true);
  if (norm == GspoAdvantageNorm::kGroupMean) return centred;
  return centred / (rewards.std(1, /*unbiased=*/true, /*keepdim=*/true) + 1e-6);
}

GspoRollout gspo_rollout(const data::DraftBatch& batch, const DraftPass& pass,
                         model::DSpineDraftImpl& draft, const at::Tensor& lm_head,
                         const GspoRolloutSettings& settings, const BlockVerifier& verifier,
                         const RowStreams& streams) {
  if (settings.group_size < 2) fail("gspo: group_size must be >= 2 (got {})", settings.group_size);
  torch::NoGradGuard no_grad;
  const int64_t group = settings.group_size;
  GspoRollout out;
  out.anchors = pass.blocks.anchors;
  out.keep = pass.blocks.keep;
  out.kept = pass.blocks.keep.reshape(-1).nonzero().squeeze(1);
  const bool refinement = settings.sampling == GspoSampling::kRefinement;
  const bool expected = settings.reward == GspoReward::kExpectedAcceptance;
  const auto rows = kept_rows(pass, out.kept, refinement);
  const int64_t blocks = rows.hidden.size(0), slots = rows.hidden.size(1);
  // Each batch row draws T·G uniforms per kept block of its own from its rollout stream, laid out
  // [K, T, G] in the kept blocks' order (row-major, so row by row); the backbone reads them as
  // rows of G per (block, slot), the refinement walk one slot's [K, G] at a time.
  const auto per_row = pass.blocks.keep.to(torch::kCPU).to(torch::kInt64).sum(1) * (slots * group);
  auto uniforms = streams.uniform(RowDraw::kRollout, per_row, torch::kFloat64)
                      .view({blocks, slots, group})
                      .to(rows.hidden.device());
  auto walk = walk_blocks(rows, draft, lm_head, settings, group, uniforms);
  out.draw_check = screen_draws(walk.tokens, walk.choices, lm_head.size(0));
  out.tokens = walk.tokens;
  out.choices = walk.choices;
  out.candidates = walk.candidates;
  out.old_logprobs = walk.logprobs;
  auto verdict = verifier.verify(batch, pass, out.kept, out.tokens, /*with_probs=*/expected);
  out.target_tokens = verdict.choices;
  out.supervised = pass.supervised.index_select(0, out.kept);
  out.accepted = accepted_prefix(out.tokens, out.target_tokens, out.supervised);
  if (expected) {
    out.rewards = expected_acceptance(verdict.token_probs, walk.probs, out.supervised);
  } else {
    out.rewards = out.accepted.to(torch::kFloat32) / static_cast<double>(slots);
  }
  out.advantages = group_advantages(out.rewards, settings.advantage_norm);
  out.supervision_weight = pass.weights.sum().item<double>();
  return out;
}

at::Tensor gspo_greedy_tokens(const DraftPass& pass, const at::Tensor& kept,
                              model::DSpineDraftImpl& draft, const at::Tensor& lm_head,
                              const GspoRolloutSettings& settings) {
  torch::NoGradGuard no_grad;
  const bool refinement = settings.sampling == GspoSampling::kRefinement;
  const auto rows = kept_rows(pass, kept, refinement);
  return walk_blocks(rows, draft, lm_head, settings, 1, Draws()).tokens.squeeze(1);
}

}  // namespace dspine::objectives
