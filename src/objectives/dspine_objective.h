// The DSpine objective as the trainer drives it (objective.name: dspine; docs/model.md, "The
// supervised objective").
//
// Trainer usage (train/objective_registry.cpp hands each part over):
//   auto objective = make_dspine_objective(draft_config, settings, accumulation_steps,
//                                          source.embed_tokens(), source.lm_head(), device,
//                                          dtype);  // model.* + model.dspine, objective.dspine
//   auto module = objective->module();        // trainable draft: optimizer, sharding, checkpoints
//   fresh run:  objective->on_fresh_start("");  // transfer space from the frozen lm_head (§6)
//   resume:     load the checkpoint's parameters AND buffers into module (transfer_codes [V, r]
//               fp32, transfer_ready bool) — never cast buffers with Module::to(dtype).
//   checkpoint: module->named_parameters() + named_buffers() are the reference state-dict keys;
//               config.json comes from the draft registry (model/draft_registry.h).
//   window:     begin_window(all A micro-batches) → micro_step(i) for i = 0..A-1 in order, each
//               followed by backward(loss) → end_window() → optimizer step.
// Each micro_step loss is numerator / D_glob (D_glob = Σ over the window's micro-batches and all
// ranks), so gradients add up with SUM over micro-batches and ranks: no further scaling.
// Collectives per window: A = 1 → one 2-element all-reduce inside micro_step; A > 1 → one in
// begin_window (after the A CE-only prepasses, none inside them), or with
// objective.dspine.prepass: skip_first one inside micro_step 0 (after A − 1 prepasses; the first
// micro-batch's replay adds its own CE and D); end_window adds one for metrics. keep_last reduces
// as skip_first; its last prepass runs with autograd and its replay continues from it (the
// replay's forward is not run again).
// The observer sees one output per prepass and per replay, in the order they run.
// Anchors and replacement masks come from the row streams of StepContext::streams(index, rows)
// (row_streams.h): the prepass and the replay of a micro-batch draw the same blocks.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "model/dspine_config.h"
#include "model/dspine_draft.h"
#include "objectives/dspine_forward.h"
#include "objectives/dspine_settings.h"
#include "objectives/objective.h"
#include "objectives/window_replay.h"

namespace dspine::objectives {

class DSpineObjective final : public Objective {
 public:
  // Trains `draft` in windows of `accumulation_steps` micro-batches (training.accumulation_steps).
  DSpineObjective(const DSpineSettings& settings, int64_t accumulation_steps,
                  model::DSpineDraft draft, at::Tensor embed_tokens, at::Tensor lm_head);

  std::string name() const override { return "dspine"; }
  std::shared_ptr<torch::nn::Module> module() { return draft_.ptr(); }
  model::DSpineDraft draft() { return draft_; }
  DSpineTrainingModel& training_model() { return model_; }
  // objective.dspine as read once when the objective was made.
  const DSpineSettings& dspine_settings() const { return settings_; }

  // Builds the transfer space from the frozen lm_head, or loads init_from (model/draft_loading.h).
  std::string on_fresh_start(const std::string& init_from) override;
  void begin_window(const std::vector<data::DraftBatch>& micro_batches,
                    StepContext& context) override;
  MicroStepResult micro_step(const data::DraftBatch& batch, int64_t index,
                             StepContext& context) override;
  std::map<std::string, double> end_window(StepContext& context) override;
  std::map<std::string, double> evaluate(const data::DraftBatch& batch,
                                         StepContext& context) override;

  // Called after every forward (prepass, replay, immediate, evaluation) — for diagnostics and
  // tests that check the replay reproduces its prepass.
  using ForwardObserver = std::function<void(const DSpineOutput&)>;
  void set_forward_observer(ForwardObserver observer) { observer_ = std::move(observer); }

 private:
  // announce_phases: a training micro-step, which announces its "forward" and "objective".
  DSpineOutput run(const data::DraftBatch& batch, const RowStreams& streams,
                   DSpineForwardOptions options, bool announce_phases = false);
  // Training, schedule step and communicator from the window's context.
  DSpineForwardOptions forward_options(const StepContext& context) const;
  void accumulate(const DSpineOutput& out);
  std::map<std::string, double> reduced_metrics(at::Tensor sums, dist::Communicator& comm,
                                                const DSpineOutput& last) const;

  DSpineSettings settings_;
  int64_t accumulation_steps_;
  model::DSpineDraft draft_;
  DSpineTrainingModel model_;
  WindowReplay window_;
  bool immediate_window_ = false;
  int64_t immediate_steps_ = 0;
  // fp64 [numerator, D, CE, L1, R, A, correct, count, coverage] on the outputs' device.
  at::Tensor window_sums_;
  DSpineSchedule window_schedule_;
  at::Tensor window_alignment_ce_;    // CE̅ of the window's last forward
  at::Tensor immediate_denominator_;  // an immediate window's reduced D, checked by end_window
  ForwardObserver observer_;
  std::optional<KeptPass> kept_;  // prepass: keep_last, until its micro-batch's replay
  int64_t kept_index_ = -1;
};

// The trainer's entry point for objective.name = dspine (see the usage above). The draft of
// `draft_config` is built on CPU fp32 from the global torch RNG (seed it first), then placed on
// (device, dtype).
std::unique_ptr<DSpineObjective> make_dspine_objective(const model::DSpineModelConfig& draft_config,
                                                       const DSpineSettings& settings,
                                                       int64_t accumulation_steps,
                                                       at::Tensor embed_tokens, at::Tensor lm_head,
                                                       torch::Device device, torch::Dtype dtype);

}  // namespace dspine::objectives
