#include "objectives/dspine_objective.h"

#include <torch/torch.h>

#include <algorithm>

#include "core/error.h"
#include "model/draft_loading.h"
#include "model/dspine_config.h"

namespace dspine::objectives {

namespace {

enum WindowSum : int64_t {
  kSumNumerator,
  kSumDenominator,
  kSumCe,
  kSumL1,
  kSumRefine,
  kSumAlign,
  kSumCorrect,
  kSumCount,
  kSumCoverage,
  kWindowSums
};

// fp64 on the outputs' device: a training window reads its sums once, in end_window.
at::Tensor output_sums(const DSpineOutput& out) {
  return torch::stack({out.numerator.detach(), out.denominator, out.ce, out.l1, out.refinement,
                       out.alignment, out.correct, out.count, out.coverage})
      .to(torch::kFloat64);
}

// numerator / D in the numerator's dtype, D a tensor: no read of D on the host.
at::Tensor share_of(const at::Tensor& numerator, const at::Tensor& denominator) {
  return numerator / denominator.to(numerator.device(), numerator.scalar_type());
}

}  // namespace

DSpineObjective::DSpineObjective(const DSpineSettings& settings, int64_t accumulation_steps,
                                 model::DSpineDraft draft, at::Tensor embed_tokens,
                                 at::Tensor lm_head)
    : settings_(settings),
      accumulation_steps_(accumulation_steps),
      draft_(std::move(draft)),
      model_(settings, draft_, std::move(embed_tokens), std::move(lm_head)) {}

std::string DSpineObjective::on_fresh_start(const std::string& init_from) {
  if (init_from.empty()) draft_->initialize_transfer_space(model_.lm_head());
  return init_from;
}

DSpineForwardOptions DSpineObjective::forward_options(const StepContext& context) const {
  DSpineForwardOptions options;
  options.training = context.training;
  options.step = context.step;
  options.total_steps = context.total_steps;
  options.comm = context.comm;
  options.device_totals = context.training;
  return options;
}

DSpineOutput DSpineObjective::run(const data::DraftBatch& batch, const RowStreams& streams,
                                  DSpineForwardOptions options, bool announce_phases) {
  DSpineOutput out;
  if (announce_phases) {
    // model_.forward split, so that the phase hook times the draft pass and the objective terms
    // apart (micro_step announces "backward" before the trainer's backward).
    announce("forward");
    auto pass = model_.draft_pass(batch, streams, options, /*full_rows=*/true);
    announce("objective");
    out = model_.objective(pass, options);
  } else {
    out = model_.forward(batch, streams, options);
  }
  if (observer_) observer_(out);
  return out;
}

void DSpineObjective::accumulate(const DSpineOutput& out) {
  auto sums = output_sums(out);
  window_sums_ = window_sums_.defined() ? window_sums_ + sums : sums;
  window_schedule_ = out.schedule;
  window_alignment_ce_ = out.alignment_ce.detach();
}

void DSpineObjective::begin_window(const std::vector<data::DraftBatch>& micro_batches,
                                   StepContext& context) {
  const int64_t expected = accumulation_steps_;
  window_.begin(static_cast<int64_t>(micro_batches.size()), expected);
  window_sums_ = at::Tensor();
  kept_.reset();
  immediate_window_ = expected == 1;
  immediate_steps_ = 0;
  if (immediate_window_) return;
  // §8.2: graph-free CE-only prepass of every micro-batch; the replay draws the same blocks from
  // the same row streams. With prepass: skip_first (or keep_last) the first micro-batch has no
  // prepass; its replay completes the window's CE̅. keep_last runs the last micro-batch's prepass
  // with autograd and keeps it as the start of its replay.
  const bool skip_first = settings_.prepass != DSpinePrepass::kAll;
  const int64_t last = static_cast<int64_t>(micro_batches.size()) - 1;
  const int64_t keep = settings_.prepass == DSpinePrepass::kKeepLast ? last : -1;
  for (int64_t i = 0; i <= last; ++i) {
    if (i == 0 && skip_first) {
      window_.record_deferred();
      continue;
    }
    const auto& batch = micro_batches[i];
    const auto streams = context.streams(i, batch.input_ids.size(0));
    DSpineOutput out;
    if (i == keep) {
      auto [kept, prepass] = model_.keep_pass(batch, streams, forward_options(context));
      kept_ = std::move(kept);
      kept_index_ = i;
      out = std::move(prepass);
      if (observer_) observer_(out);
    } else {
      torch::NoGradGuard no_grad;
      auto options = forward_options(context);
      options.ce_only = true;
      out = run(batch, streams, options);
    }
    window_.record_prepass(out.ce, out.denominator);
  }
  if (!skip_first) window_.reduce(*context.comm);
}

MicroStepResult DSpineObjective::micro_step(const data::DraftBatch& batch, int64_t index,
                                            StepContext& context) {
  auto options = forward_options(context);
  if (immediate_window_) {
    window_.check_immediate();
    if (index != 0 || immediate_steps_ != 0) {
      fail("DSpine immediate window has one micro-batch; got micro-step {}", index);
    }
    ++immediate_steps_;
    auto out = run(batch, context.streams(index, batch.input_ids.size(0)), options,
                   /*announce_phases=*/true);
    accumulate(out);
    immediate_denominator_ = out.global_denominator;  // on the GPU: checked by end_window
    if (!immediate_denominator_.is_cuda()) check_supervised(immediate_denominator_.item<double>());
    announce("backward");
    return {share_of(out.numerator, out.global_denominator)};
  }
  if (!window_.active()) fail("DSpine micro_step {} without begin_window", index);
  window_.begin_replay(index);
  if (window_.deferred(index)) {
    options.prepassed_totals = window_.prepassed_totals();  // reduced inside its forward
  } else {
    options.alignment_ce = window_.alignment_ce();
  }
  DSpineOutput out;
  if (kept_ && index == kept_index_) {
    // The prepass ran this micro-batch's draft pass (and fused vocabulary terms) with autograd.
    announce("objective");
    const auto* vocabulary = kept_->vocabulary ? &*kept_->vocabulary : nullptr;
    out = model_.objective(kept_->pass, options, vocabulary);
    kept_.reset();
    if (observer_) observer_(out);
  } else {
    out = run(batch, context.streams(index, batch.input_ids.size(0)), options,
              /*announce_phases=*/true);
  }
  if (window_.deferred(index)) window_.complete(out.global_ce, out.global_denominator);
  window_.finish_replay(index, out.denominator);
  accumulate(out);
  announce("backward");
  return {share_of(out.numerator, window_.global_denominator())};
}

std::map<std::string, double> DSpineObjective::reduced_metrics(at::Tensor sums,
                                                               dist::Communicator& comm,
                                                               const DSpineOutput& last) const {
  sums = (comm.reduces_device_tensors() ? sums : sums.cpu()).contiguous();
  comm.all_reduce(sums);
  sums = sums.cpu();
  auto s = sums.accessor<double, 1>();
  const double d = s[kSumDenominator];
  const double count = std::max(s[kSumCount], 1.0);
  const double ratio_d = std::max(d, 1e-30);
  return {
      {"loss", s[kSumNumerator] / ratio_d},
      {"accuracy", s[kSumCorrect] / count},
      {"tokens", s[kSumCount]},
      {"dspine/denominator", d},
      {"dspine/backbone_ce", s[kSumCe] / ratio_d},
      {"dspine/backbone_l1", s[kSumL1] / ratio_d},
      {"dspine/refinement_loss", s[kSumRefine] / ratio_d},
      {"dspine/alignment_loss", s[kSumAlign] / ratio_d},
      {"dspine/candidate_coverage", s[kSumCoverage] / count},
      {"dspine/alignment_beta", last.schedule.alignment_beta},
      {"dspine/replacement_probability", last.schedule.replacement_probability},
      {"dspine/alignment_ce", last.alignment_ce.item<double>()},
  };
}

std::map<std::string, double> DSpineObjective::end_window(StepContext& context) {
  if (immediate_window_) {
    if (immediate_steps_ != 1) fail("DSpine window ended before its micro-step ran");
    check_supervised(immediate_denominator_.item<double>());
  } else {
    window_.end();
  }
  DSpineOutput last;
  last.schedule = window_schedule_;
  last.alignment_ce = window_alignment_ce_;
  auto metrics = reduced_metrics(window_sums_, *context.comm, last);
  window_sums_ = at::Tensor();
  kept_.reset();
  immediate_steps_ = 0;
  immediate_window_ = false;
  return metrics;
}

std::map<std::string, double> DSpineObjective::evaluate(const data::DraftBatch& batch,
                                                        StepContext& context) {
  // §8.6: evaluation never replays; no replacement outside training.
  window_.check_immediate();
  torch::NoGradGuard no_grad;
  auto options = forward_options(context);
  options.training = false;
  options.device_totals = false;
  auto out = run(batch, context.streams(0, batch.input_ids.size(0)), options);
  return reduced_metrics(output_sums(out), *context.comm, out);
}

std::unique_ptr<DSpineObjective> make_dspine_objective(const model::DSpineModelConfig& draft_config,
                                                       const DSpineSettings& settings,
                                                       int64_t accumulation_steps,
                                                       at::Tensor embed_tokens, at::Tensor lm_head,
                                                       torch::Device device, torch::Dtype dtype) {
  return std::make_unique<DSpineObjective>(settings, accumulation_steps,
                                           model::build_placed_draft(draft_config, device, dtype),
                                           std::move(embed_tokens), std::move(lm_head));
}

}  // namespace dspine::objectives
