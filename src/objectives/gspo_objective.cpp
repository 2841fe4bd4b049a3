#include "objectives/gspo_objective.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <chrono>
#include <optional>

#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "model/dspine_config.h"
#include "model/draft_loading.h"
#include "objectives/dspine_terms.h"
#include "objectives/gspo_policy_loss.h"
#include "ops/vocab_objective_ops.h"

namespace dspine::objectives {
namespace {

// Wall time of the seam: CUDA events around it on the GPU (reading them waits for the seam, so
// they are read at the window's end), the host clock on the CPU.
class SeamTimer {
 public:
  explicit SeamTimer(const torch::Device& device) : cuda_(device.is_cuda()) {
    if (cuda_) {
      start_.emplace(cudaEventDefault);
      stop_.emplace(cudaEventDefault);
      start_->record(c10::cuda::getCurrentCUDAStream(device.index()));
    } else {
      host_start_ = std::chrono::steady_clock::now();
    }
  }
  void stop() {
    if (cuda_) {
      stop_->record(c10::cuda::getCurrentCUDAStream());
    } else {
      host_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - host_start_)
                          .count();
    }
  }
  double seconds() {
    if (!cuda_) return host_seconds_;
    stop_->synchronize();
    return start_->elapsed_time(*stop_) / 1000.0;
  }

 private:
  bool cuda_;
  std::optional<at::cuda::CUDAEvent> start_, stop_;
  std::chrono::steady_clock::time_point host_start_;
  double host_seconds_ = 0;
};

// Sum layout of update_sums_ (this rank's shares; summed over ranks they are global values).
enum UpdateSum : size_t {
  kUpdateLoss,          // total loss (GSPO + ce_weight·DSpine)
  kUpdateGspoLoss,
  kUpdateNewLogprobs,
  kUpdateClipped,
  kUpdateRatioMean,
  kUpdateKl,
  kUpdateSupervised,    // the DSpine loss part (ce_weight > 0)
  kUpdateSums
};

enum RolloutSum : size_t { kRolloutSegments, kRolloutReward, kRolloutAccepted, kRolloutSums };

// What begin_window sums over ranks before any update: the loss's divisors and the fault flag.
enum WindowStartSum : int64_t { kStartSegments, kStartDSpineWeights, kStartFaults, kStartSums };

// What evaluate sums over ranks: the sampled rollout's and the greedy blocks' counts.
enum EvalSum : int64_t {
  kEvalSegments,
  kEvalReward,
  kEvalAccepted,
  kEvalGreedyBlocks,
  kEvalGreedyAccepted,
  kEvalSums
};

// The update's policy rows and sampled tokens of one rollout.
struct PolicyRows {
  at::Tensor logits;  // [R, C] with grad
  GspoPolicySamples samples;
};

at::Tensor masked_targets(const at::Tensor& choices, const at::Tensor& supervised) {
  return at::where(supervised, choices, at::full({}, -100, choices.options()));
}

// Backbone: the K·T slot rows of the backbone logits, each shared by the G samples of its block.
PolicyRows backbone_rows(const DraftPass& pass, const GspoRollout& r, const at::Tensor& lm_head) {
  const int64_t blocks = r.tokens.size(0), group = r.tokens.size(1), slots = r.tokens.size(2);
  PolicyRows out;
  auto hidden = pass.hidden_rows.index_select(0, r.kept);
  out.logits = project_logits(hidden, lm_head).view({blocks * slots, -1});
  auto per_slot = [&](const at::Tensor& t) {  // [K, G, T] → [K·T, G]
    return t.permute({0, 2, 1}).reshape({blocks * slots, group});
  };
  auto& s = out.samples;
  s.targets = per_slot(masked_targets(r.choices, r.supervised.unsqueeze(1)));
  s.old_logprobs = per_slot(r.old_logprobs);
  s.advantages = per_slot(r.advantages.unsqueeze(2).expand({blocks, group, slots}));
  auto segment = torch::arange(blocks * group, r.tokens.options()).view({blocks, group, 1});
  s.segments = per_slot(segment.expand({blocks, group, slots}));
  auto counts = r.supervised.sum(1).view({blocks, 1, 1});
  s.label_counts = per_slot(counts.expand({blocks, group, slots}));
  // Seam order (block, sample, slot): row-major index of token (k, g, t) is (k·T + t)·G + g.
  s.seam_order = torch::arange(blocks * slots * group, r.tokens.options())
                     .view({blocks, slots, group})
                     .permute({0, 2, 1})
                     .reshape(-1);
  s.num_segments = blocks * group;
  return out;
}

// Refinement: one row per (block, sample, slot) over the slot's k candidates, scored by
// refine(pre, previous sampled token) as in the rollout's walk.
PolicyRows refinement_rows(const DraftPass& pass, const GspoRollout& r,
                           model::DSpineDraftImpl& draft, const at::Tensor& lm_head) {
  const int64_t blocks = r.tokens.size(0), group = r.tokens.size(1), slots = r.tokens.size(2);
  const int64_t hidden = pass.pre_rows.size(2), k = r.candidates.size(2);
  auto pre = pass.pre_rows.index_select(0, r.kept).unsqueeze(1).expand({blocks, group, slots, hidden});
  auto anchor = pass.predecessors.index_select(0, r.kept).select(1, 0).view({blocks, 1, 1});
  auto previous = torch::cat({anchor.expand({blocks, group, 1}), r.tokens.narrow(2, 0, slots - 1)}, 2);
  auto refined = draft.refine(pre, previous);  // [K, G, T, H]
  auto heads = lm_head.index_select(0, r.candidates.reshape(-1)).view({blocks, 1, slots, k, hidden});
  auto scores = refined.unsqueeze(3).matmul(heads.transpose(3, 4)).squeeze(3);  // [K, G, T, k]
  PolicyRows out;
  out.logits = scores.reshape({blocks * group * slots, k});
  auto& s = out.samples;
  auto flat = [&](const at::Tensor& t) { return t.reshape({blocks * group * slots, 1}); };
  s.targets = flat(masked_targets(r.choices, r.supervised.unsqueeze(1)));
  s.old_logprobs = flat(r.old_logprobs);
  s.advantages = flat(r.advantages.unsqueeze(2).expand({blocks, group, slots}));
  s.segments = flat(torch::arange(blocks * group, r.tokens.options())
                        .view({blocks, group, 1})
                        .expand({blocks, group, slots}));
  s.label_counts = flat(r.supervised.sum(1).view({blocks, 1, 1}).expand({blocks, group, slots}));
  s.seam_order = torch::arange(blocks * group * slots, r.tokens.options());
  s.num_segments = blocks * group;
  return out;
}

// KL(rollout ‖ policy) per segment by the k3 estimator r − 1 − log r (r = π/π_old, ≥ 0), averaged
// over the segment's labelled tokens (label_counts broadcasts to the log-probs); this rank's share
// of the mean over the D segments, as an fp64 scalar on the log-probs' device.
at::Tensor kl_share(const at::Tensor& logprobs, const at::Tensor& old_logprobs,
                    const at::Tensor& mask, const at::Tensor& label_counts, double divisor) {
  auto log_ratio = (logprobs - old_logprobs).masked_fill(~mask, 0.0);
  auto k3 = log_ratio.exp() - 1.0 - log_ratio;
  auto weight = mask.to(torch::kFloat32) / label_counts.clamp_min(1).to(torch::kFloat32);
  return (k3 * weight).sum().to(torch::kFloat64) / divisor;
}

at::Tensor reduced(std::vector<double> values, dist::Communicator& comm) {
  auto t = torch::tensor(values, torch::kFloat64).contiguous();
  comm.all_reduce(t);
  return t;
}

}  // namespace

core::Settings settings_of(GspoSettings& s, const core::Config& run) {
  GspoRolloutSettings& r = s.rollout;
  // objective.gspo.init_from is the older name of training.init_from.
  const auto init_rule =
      core::rule("a starting point, the same as training.init_from's when both are set",
                 [&s, &run](const std::string& key) {
                   const std::string& init_from = run.training.init_from;
                   std::optional<core::RuleFailure> failure;
                   if (!s.init_from.empty() && !init_from.empty() && s.init_from != init_from) {
                     failure = core::out_of_range(
                         key, s.init_from,
                         "a starting point, the same as training.init_from's when both are set");
                   }
                   return failure;
                 });
  return {
      {"group_size", &r.group_size,
       core::require(
           r.group_size, [](int64_t v) { return v >= 2; },
           "integer >= 2 (advantages compare the blocks of a group)"),
       "blocks sampled per kept anchor (G)"},
      {"temperature", &r.temperature, core::positive(r.temperature),
       "sampling temperature of the rollout"},
      {"sampling",
       core::choice_target(&r.sampling),
       {},
       "sample the backbone's slots, or walk the refinement head"},
      {"reward",
       core::choice_target(&r.reward),
       {},
       "accepted prefix, or expected acceptance under the target's distribution"},
      {"reward_source",
       core::choice_target(&s.reward_source),
       {},
       "verify against the target (online, else its states in the data), or the data's tokens"},
      {"advantage_norm",
       core::choice_target(&r.advantage_norm),
       {},
       "rewards minus the group mean (group_std: then over the std)"},
      {"eps_low", &s.eps_low, core::fraction(s.eps_low), "clip range below 1 of the segment ratio"},
      {"eps_high", &s.eps_high, core::nonnegative(s.eps_high),
       "clip range above 1 of the segment ratio"},
      {"logits_scale", &r.logits_scale, core::positive(r.logits_scale),
       "multiplies the logits of the policy"},
      {"updates_per_rollout", &s.updates_per_rollout, core::at_least(s.updates_per_rollout, 1),
       "optimizer updates per rollout"},
      {"ce_weight", &s.ce_weight, core::nonnegative(s.ce_weight),
       "weight of the supervised DSpine loss beside RL"},
      {"init_from", &s.init_from, init_rule,
       "older name of training.init_from: checkpoint, export or weights to start from"},
  };
}

GspoObjective::GspoObjective(const DSpineSettings& dspine, const GspoSettings& settings,
                             int64_t accumulation_steps, model::DSpineDraft draft,
                             at::Tensor embed_tokens, at::Tensor lm_head,
                             const target::Qwen3Model* online_target)
    : dspine_(dspine),
      settings_(settings),
      accumulation_steps_(accumulation_steps),
      draft_(std::move(draft)),
      model_(dspine, draft_, std::move(embed_tokens), std::move(lm_head)) {
  settings_.rollout.top_k = draft_->config().dspine.top_k;
  settings_.rollout.chunk_blocks = dspine.objective_chunk_blocks;
  verifier_ = make_reward_verifier(settings_.reward_source, online_target, model_.lm_head(),
                                   dspine.objective_chunk_blocks);
}

std::string GspoObjective::on_fresh_start(const std::string& init_from) {
  const std::string& path = settings_.init_from.empty() ? init_from : settings_.init_from;
  if (path.empty()) draft_->initialize_transfer_space(model_.lm_head());
  return path;
}

DraftPass GspoObjective::pass(const data::DraftBatch& batch, const RowStreams& streams,
                              StepContext& context, const BlockOverrides* blocks, bool full_rows) {
  DSpineForwardOptions options;
  options.step = context.step;
  options.total_steps = context.total_steps;
  options.training = false;  // RL draws no replacement: the policy sees its own predecessors
  options.comm = context.comm;
  options.overrides = blocks;
  return model_.draft_pass(batch, streams, options, full_rows);
}

GspoRolloutSettings GspoObjective::rollout_settings() const {
  auto r = settings_.rollout;
  // The row pass also runs on the CPU (through the seam's reference); the row kernel needs CUDA.
  r.fused_sampling = model_.fused_vocabulary() && model_.lm_head().is_cuda();
  return r;
}

void GspoObjective::begin_window(const std::vector<data::DraftBatch>& micro_batches,
                                 StepContext& context) {
  if (static_cast<int64_t>(micro_batches.size()) != accumulation_steps_)
    fail("gspo: the window has {} micro-batches, training.accumulation_steps is {}",
         micro_batches.size(), accumulation_steps_);
  torch::NoGradGuard no_grad;
  const auto r = rollout_settings();
  const bool full = r.sampling == GspoSampling::kRefinement || verifier_->needs_teacher_states();
  std::vector<GspoRollout> rollouts;
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const auto& batch = micro_batches[i];
    const auto streams = context.streams(static_cast<int64_t>(i), batch.input_ids.size(0));
    auto p = pass(batch, streams, context, nullptr, full);
    rollouts.push_back(gspo_rollout(batch, p, *draft_, model_.lm_head(), r, *verifier_, streams));
  }
  adopt_rollouts(std::move(rollouts), context);
}

void GspoObjective::adopt_rollouts(std::vector<GspoRollout> rollouts, StepContext& context) {
  rollouts_ = std::move(rollouts);
  rollout_sums_.assign(kRolloutSums, 0.0);
  update_sums_ = at::Tensor();
  seam_times_.clear();
  // Every rollout's sums and draw check in one copy to the host: the updates then run without
  // synchronising.
  std::vector<at::Tensor> per_rollout;
  for (const auto& rollout : rollouts_) {
    auto sums = rollout.rewards.sum().to(torch::kFloat64).view({1});
    auto check = rollout.draw_check.defined()
                     ? rollout.draw_check
                     : at::zeros({kDrawCheckSize}, sums.options());  // made elsewhere, unchecked
    per_rollout.push_back(
        torch::cat({sums, rollout.accepted.sum().to(torch::kFloat64).view({1}), check}));
  }
  double weights = 0;
  std::optional<std::string> fault;  // this rank's first rollout that drew outside the vocabulary
  if (!per_rollout.empty()) {
    const auto host = torch::stack(per_rollout).cpu().contiguous();
    const auto sums = host.accessor<double, 2>();
    for (size_t i = 0; i < rollouts_.size(); ++i) {
      const auto& rollout = rollouts_[i];
      rollout_sums_[kRolloutSegments] += static_cast<double>(rollout.rewards.numel());
      rollout_sums_[kRolloutReward] += sums[i][0];
      rollout_sums_[kRolloutAccepted] += sums[i][1];
      weights += rollout.supervision_weight;
      const double* check = host[i].data_ptr<double>() + 2;
      const int64_t vocab = model_.lm_head().size(0);
      if (!fault) {
        if (auto what = draw_fault(rollout, check, vocab)) {
          fault = fmt::format("rank {}, micro-batch {}: {}", context.comm->rank(), i, *what);
        }
      }
      if (auto what = undrawn_rows(rollout, check)) {
        log::warn("step {}: rank {}, micro-batch {}: {}", context.step + 1, context.comm->rank(),
                  i, *what);
      }
    }
  }
  std::vector<double> start(kStartSums);
  start[kStartSegments] = rollout_sums_[kRolloutSegments];
  start[kStartDSpineWeights] = weights;
  start[kStartFaults] = fault ? 1.0 : 0.0;
  const auto totals = reduced(start, *context.comm);
  const auto t = totals.accessor<double, 1>();
  // Every rank stops alike, before any update: the trainer saves the state before this window.
  if (t[kStartFaults] > 0)
    throw WindowFailure(fault.value_or("another rank's rollout drew a token outside the "
                                       "vocabulary"));
  divisor_ = t[kStartSegments];
  dspine_denominator_ = t[kStartDSpineWeights];
  if (!(divisor_ > 0)) fail("gspo: the window has no anchor block on any rank");
}

MicroStepResult GspoObjective::micro_step(const data::DraftBatch& batch, int64_t index,
                                          StepContext& context) {
  if (index < 0 || index >= static_cast<int64_t>(rollouts_.size()))
    fail("gspo: micro-step {} has no rollout (begin_window first)", index);
  const auto& rollout = rollouts_[index];
  const bool refinement = settings_.rollout.sampling == GspoSampling::kRefinement;
  const bool supervised = settings_.ce_weight > 0;
  BlockOverrides blocks{rollout.anchors, rollout.keep, at::Tensor()};
  // The rollout's blocks are replayed: nothing is drawn.
  auto p = pass(batch, context.streams(index, batch.input_ids.size(0)), context, &blocks,
                refinement || supervised);
  DSpineForwardOptions options;
  options.step = context.step;
  options.total_steps = context.total_steps;
  options.training = false;
  options.comm = context.comm;  // alignment scale from this micro-batch over all ranks
  // The backbone's policy term goes through the vocabulary row pass where that pass is fused;
  // the refinement head's rows are only k wide and keep the separate seam.
  // A micro-batch without kept blocks has no rows for the policy-only pass to project.
  const bool row_pass = !refinement && model_.fused_vocabulary() &&
                        (supervised || rollout.kept.numel() > 0);
  const auto result = row_pass ? row_pass_update(p, rollout, options)
                               : separate_seam_update(p, rollout, options);
  // The metric shares stay on the device until end_window: reading them here would empty the
  // GPU's queue between this forward and its backward.
  auto f64 = [](const at::Tensor& t) { return t.detach().to(torch::kFloat64); };
  const auto supervised_part =
      result.supervised.defined() ? f64(result.supervised) : at::zeros_like(f64(result.kl));
  auto shares = torch::stack({f64(result.loss), f64(result.policy.loss),
                              f64(result.policy.new_logprobs), f64(result.policy.clipped_fraction),
                              f64(result.policy.ratio_mean), f64(result.kl), supervised_part});
  update_sums_ = update_sums_.defined() ? update_sums_ + shares : shares;
  return {result.loss};
}

GspoObjective::Update GspoObjective::row_pass_update(const DraftPass& p, const GspoRollout& rollout,
                                                     DSpineForwardOptions& options) {
  const bool supervised = settings_.ce_weight > 0;
  // Without the supervised terms only the kept blocks are projected; with them, all M blocks
  // are, and the dropped ones carry masked samples.
  const int64_t blocks = supervised ? p.hidden_rows.size(0) : rollout.kept.size(0);
  const auto targets = masked_targets(rollout.choices, rollout.supervised.unsqueeze(1));
  ops::VocabPolicy policy;
  policy.logits_scale = settings_.rollout.logits_scale;
  policy.eps_low = settings_.eps_low;
  policy.eps_high = settings_.eps_high;
  policy.divisor = divisor_;
  const auto counts = rollout.supervised.sum(1);
  if (supervised) {
    // Kept block k's values at row kept[k] of all M blocks, `fill` elsewhere.
    auto over_all_blocks = [&](const at::Tensor& values, double fill) {
      auto sizes = values.sizes().vec();
      sizes[0] = blocks;
      return at::full(sizes, fill, values.options()).index_copy_(0, rollout.kept, values);
    };
    policy.targets = over_all_blocks(targets, -100);
    policy.old_logprobs = over_all_blocks(rollout.old_logprobs, 0);
    policy.advantages = over_all_blocks(rollout.advantages, 0);
    policy.label_counts = over_all_blocks(counts, 0);
    // ρ = D_dspine / ce_weight: the op's numerator scaled back by ce_weight / D_dspine leaves the
    // policy loss with weight 1.
    policy.loss_scale = dspine_denominator_ / settings_.ce_weight;
  } else {
    policy.targets = targets;
    policy.old_logprobs = rollout.old_logprobs;
    policy.advantages = rollout.advantages;
    policy.label_counts = counts;
  }
  Update out;
  if (supervised) {
    options.policy = &policy;
    auto terms = model_.objective(p, options);
    out.policy = terms.policy;
    out.loss = settings_.ce_weight * (terms.numerator / dspine_denominator_);
    out.supervised = (terms.numerator.detach().to(torch::kFloat64) -
                      policy.loss_scale * out.policy.loss.detach().to(torch::kFloat64)) /
                     dspine_denominator_;
  } else {
    ops::VocabObjectiveOptions vocab;
    vocab.policy = &policy;
    const auto hidden = p.hidden_rows.index_select(0, rollout.kept);
    auto rows =
        ops::vocab_policy_objective(hidden.reshape({-1, hidden.size(-1)}), model_.lm_head(), vocab);
    out.policy = rows.policy;
    out.loss = rows.loss;
  }
  const auto mask = policy.targets.ge(0);
  out.kl = kl_share(out.policy.logprobs, policy.old_logprobs, mask,
                    policy.label_counts.view({blocks, 1, 1}), divisor_);
  return out;
}

GspoObjective::Update GspoObjective::separate_seam_update(const DraftPass& p,
                                                          const GspoRollout& rollout,
                                                          const DSpineForwardOptions& options) {
  const bool refinement = settings_.rollout.sampling == GspoSampling::kRefinement;
  auto rows = refinement ? refinement_rows(p, rollout, *draft_, model_.lm_head())
                         : backbone_rows(p, rollout, model_.lm_head());
  ops::GspoSeamParams params;
  params.logits_scale = settings_.rollout.logits_scale;
  params.eps_low = settings_.eps_low;
  params.eps_high = settings_.eps_high;
  params.divisor = divisor_;
  auto timer = std::make_shared<SeamTimer>(rows.logits.device());
  auto policy = gspo_policy_loss(rows.logits, rows.samples, params, *options.comm);
  timer->stop();
  seam_times_.push_back([timer] { return timer->seconds(); });
  Update out;
  out.policy = {policy.logprobs, policy.seam.loss, policy.seam.new_logprobs,
                policy.seam.clipped_fraction, policy.seam.ratio_mean};
  out.loss = policy.loss;
  if (settings_.ce_weight > 0) {
    auto terms = model_.objective(p, options);
    auto part = terms.numerator / dspine_denominator_;
    out.supervised = part.detach();
    out.loss = out.loss + settings_.ce_weight * part.to(out.loss.scalar_type());
  }
  const auto mask = rows.samples.targets.ge(0);
  out.kl = kl_share(policy.logprobs, rows.samples.old_logprobs, mask, rows.samples.label_counts,
                    divisor_);
  return out;
}

std::map<std::string, double> GspoObjective::end_window(StepContext& context) {
  std::vector<double> update(kUpdateSums, 0.0);  // a rank may end a window without an update
  if (update_sums_.defined()) {
    const auto local = update_sums_.cpu();  // the window's one read of the update metrics
    std::copy_n(local.data_ptr<double>(), kUpdateSums, update.begin());
  }
  update.insert(update.end(), rollout_sums_.begin(), rollout_sums_.end());
  auto sums = reduced(update, *context.comm);
  auto s = sums.accessor<double, 1>();
  double seam_seconds = 0;
  for (const auto& seconds : seam_times_) seam_seconds += seconds();
  seam_times_.clear();
  const double updates = static_cast<double>(settings_.updates_per_rollout);
  const double segments = std::max(s[kUpdateSums + kRolloutSegments], 1.0);
  std::map<std::string, double> metrics = {
      {"loss", s[kUpdateLoss] / updates},
      {"gspo/loss", s[kUpdateGspoLoss] / updates},
      {"gspo/new_logprobs", s[kUpdateNewLogprobs] / updates},
      {"gspo/clipped_fraction", s[kUpdateClipped] / updates},
      {"gspo/ratio_mean", s[kUpdateRatioMean] / updates},
      {"gspo/kl", s[kUpdateKl] / updates},
      {kRewardMetric, s[kUpdateSums + kRolloutReward] / segments},
      // τ: the accepted prefix plus the token the target itself adds at verification.
      {kAcceptedLengthMetric, s[kUpdateSums + kRolloutAccepted] / segments + 1.0},
      {"gspo/segments", segments},
      {kSeamSecondsMetric, seam_seconds},
  };
  if (settings_.ce_weight > 0) metrics["gspo/dspine_loss"] = s[kUpdateSupervised] / updates;
  rollouts_.clear();
  return metrics;
}

std::map<std::string, double> GspoObjective::evaluate(const data::DraftBatch& batch,
                                                      StepContext& context) {
  torch::NoGradGuard no_grad;
  const auto r = rollout_settings();
  const auto streams = context.streams(0, batch.input_ids.size(0));
  auto p = pass(batch, streams, context, nullptr, true);
  auto rollout = gspo_rollout(batch, p, *draft_, model_.lm_head(), r, *verifier_, streams);
  const auto check = rollout.draw_check.to(torch::kCPU).contiguous();
  if (auto fault = draw_fault(rollout, check.data_ptr<double>(), model_.lm_head().size(0)))
    fail("gspo evaluation, rank {}: {}", context.comm->rank(), *fault);
  auto greedy = gspo_greedy_tokens(p, rollout.kept, *draft_, model_.lm_head(), r).unsqueeze(1);
  auto verdict = verifier_->verify(batch, p, rollout.kept, greedy, /*with_probs=*/false);
  auto greedy_accepted = accepted_prefix(greedy, verdict.choices, rollout.supervised);
  std::vector<double> local(kEvalSums);
  local[kEvalSegments] = static_cast<double>(rollout.rewards.numel());
  local[kEvalReward] = rollout.rewards.sum().item<double>();
  local[kEvalAccepted] = rollout.accepted.sum().item<double>();
  local[kEvalGreedyBlocks] = static_cast<double>(greedy_accepted.numel());
  local[kEvalGreedyAccepted] = greedy_accepted.sum().item<double>();
  const auto sums = reduced(local, *context.comm);
  const auto s = sums.accessor<double, 1>();
  const double segments = std::max(s[kEvalSegments], 1.0);
  const double blocks = std::max(s[kEvalGreedyBlocks], 1.0);
  return {
      {kRewardMetric, s[kEvalReward] / segments},
      {kAcceptedLengthMetric, s[kEvalAccepted] / segments + 1.0},
      {"gspo/greedy_accepted_length", s[kEvalGreedyAccepted] / blocks + 1.0},
      {"gspo/blocks", s[kEvalGreedyBlocks]},
  };
}

std::unique_ptr<GspoObjective> make_gspo_objective(const model::DSpineModelConfig& draft_config,
                                                   const DSpineSettings& dspine,
                                                   const GspoSettings& settings,
                                                   int64_t accumulation_steps,
                                                   at::Tensor embed_tokens, at::Tensor lm_head,
                                                   torch::Device device, torch::Dtype dtype,
                                                   const target::Qwen3Model* online_target) {
  return std::make_unique<GspoObjective>(
      dspine, settings, accumulation_steps, model::build_placed_draft(draft_config, device, dtype),
      std::move(embed_tokens), std::move(lm_head), online_target);
}

}  // namespace dspine::objectives
