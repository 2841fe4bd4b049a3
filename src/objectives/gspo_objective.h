// The GSPO RL objective (objective.name: gspo; docs/gspo.md, "RL steps"). The DSpine draft is the
// policy and one sampled draft block is one GSPO segment.
//
// Window: begin_window rolls out every micro-batch without gradients (anchors as in supervised
// training, G blocks per kept anchor, rewards, group advantages) and reduces the divisor D (the
// window's segments over all ranks) with one all-reduce. The trainer then runs
// updates_per_window() = updates_per_rollout optimizer updates on that rollout: each re-runs the
// draft with gradients on the same anchor blocks and puts the sampled tokens' logits through the
// GSPO seam. From the second update on the policy differs from the rollout's, so the ratios
// differ from 1 and clipping acts. ce_weight > 0 adds the supervised DSpine loss of the same
// blocks. Metrics are reduced over ranks in end_window.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/settings.h"
#include "target/qwen3_model.h"
#include "model/dspine_config.h"
#include "model/dspine_draft.h"
#include "objectives/block_verifier.h"
#include "objectives/dspine_forward.h"
#include "objectives/dspine_settings.h"
#include "objectives/gspo_rollout.h"
#include "objectives/objective.h"

namespace dspine::objectives {

// objective.gspo.*, with the rollout's top_k from model.dspine and its chunking from
// objective.dspine.
struct GspoSettings {
  GspoRolloutSettings rollout;
  double eps_low = 3e-4;
  double eps_high = 4e-4;
  int64_t updates_per_rollout = 1;
  double ce_weight = 0.0;
  RewardSource reward_source = RewardSource::kTarget;
  std::string init_from;  // checkpoint or export directory, or a draft .safetensors; "" = fresh draft
};

// The declaration of objective.gspo (core/settings.h); errors name the full key, e.g.
// objective.gspo.group_size. init_from's rule reads `run`'s training.init_from.
core::Settings settings_of(GspoSettings& settings, const core::Config& run);

// Its metric keys that the trainer's console shows (progress_metrics).
inline constexpr const char* kRewardMetric = "gspo/reward";
inline constexpr const char* kAcceptedLengthMetric = "gspo/accepted_length";

class GspoObjective final : public Objective {
 public:
  // Trains `draft` (make_gspo_objective) in windows of `accumulation_steps` micro-batches; the
  // rollout's refinement candidates are the draft's model.dspine.top_k. `online_target` (may be
  // null) verifies the rollouts when reward_source is target.
  GspoObjective(const DSpineSettings& dspine, const GspoSettings& settings,
                int64_t accumulation_steps, model::DSpineDraft draft, at::Tensor embed_tokens,
                at::Tensor lm_head, const target::Qwen3Model* online_target = nullptr);

  std::string name() const override { return "gspo"; }
  std::shared_ptr<torch::nn::Module> module() { return draft_.ptr(); }
  model::DSpineDraft draft() { return draft_; }
  DSpineTrainingModel& training_model() { return model_; }
  // objective.dspine (how anchor blocks are sampled) as read once when the objective was made.
  const DSpineSettings& dspine_settings() const { return dspine_; }
  // objective.gspo as read once, with the rollout's top_k from the draft (model.dspine.top_k) and
  // its chunking from objective.dspine.
  const GspoSettings& gspo_settings() const { return settings_; }
  int64_t updates_per_window() const override { return settings_.updates_per_rollout; }

  // Loads training.init_from or its alias objective.gspo.init_from (weights and transfer codes),
  // or builds the transfer space of a fresh draft.
  std::string on_fresh_start(const std::string& init_from) override;
  void begin_window(const std::vector<data::DraftBatch>& micro_batches,
                    StepContext& context) override;
  // The window from rollouts made elsewhere (another split of the batch over ranks, another
  // process): one per micro-batch, in order; reduces D like begin_window.
  void adopt_rollouts(std::vector<GspoRollout> rollouts, StepContext& context);
  const std::vector<GspoRollout>& window_rollouts() const { return rollouts_; }
  MicroStepResult micro_step(const data::DraftBatch& batch, int64_t index,
                             StepContext& context) override;
  std::map<std::string, double> end_window(StepContext& context) override;
  std::vector<std::string> progress_metrics() const override {
    return {kRewardMetric, kAcceptedLengthMetric};
  }
  // Rollout metrics plus the greedy (inference-path) accepted length of every anchor block.
  std::map<std::string, double> evaluate(const data::DraftBatch& batch,
                                         StepContext& context) override;

 private:
  // The rollout's settings, sampling through the fused row kernel where the vocabulary terms are
  // fused.
  GspoRolloutSettings rollout_settings() const;
  DraftPass pass(const data::DraftBatch& batch, const RowStreams& streams, StepContext& context,
                 const BlockOverrides* blocks, bool full_rows);

  // One update's loss (with grad) and its metric shares (scalars on the device).
  struct Update {
    at::Tensor loss;
    ops::VocabPolicyResult policy;
    at::Tensor kl;          // fp64
    at::Tensor supervised;  // fp64, the DSpine loss part (ce_weight > 0), else undefined
  };
  // The policy term inside the vocabulary row pass (ops/vocab_policy.h): the backbone's sampled
  // tokens on the fused vocabulary path.
  Update row_pass_update(const DraftPass& pass, const GspoRollout& rollout,
                         DSpineForwardOptions& options);
  // The policy logits projected on their own and put through the seam (gspo_policy_loss.h): the
  // refinement head's rows, and the reference for the row pass.
  Update separate_seam_update(const DraftPass& pass, const GspoRollout& rollout,
                              const DSpineForwardOptions& options);

  DSpineSettings dspine_;
  GspoSettings settings_;
  int64_t accumulation_steps_;
  model::DSpineDraft draft_;
  DSpineTrainingModel model_;
  std::unique_ptr<BlockVerifier> verifier_;  // scores the rollouts
  std::vector<GspoRollout> rollouts_;  // the window's, one per micro-batch
  double divisor_ = 1;                 // D: the window's segments over all ranks
  double dspine_denominator_ = 1;      // the window's Σ supervision weights over all ranks
  std::vector<double> rollout_sums_;   // [segments, Σ reward, Σ accepted] of this rank's window
  at::Tensor update_sums_;  // fp64 on the device: this rank's metric shares, summed over the window
  // The seam's timers of the window, read in end_window: reading one waits for its seam, which
  // inside the step would stall the host (end_window reads the device anyway).
  std::vector<std::function<double()>> seam_times_;
};

// The trainer's entry point for objective.name = gspo; the draft of `draft_config` is built as by
// make_dspine_objective (objectives/dspine_objective.h).
std::unique_ptr<GspoObjective> make_gspo_objective(
    const model::DSpineModelConfig& draft_config, const DSpineSettings& dspine,
    const GspoSettings& settings, int64_t accumulation_steps, at::Tensor embed_tokens,
    at::Tensor lm_head, torch::Device device, torch::Dtype dtype,
    const target::Qwen3Model* online_target = nullptr);

}  // namespace dspine::objectives
