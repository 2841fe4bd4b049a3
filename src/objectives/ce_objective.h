// Next-token cross-entropy for the simple draft (objective.name: ce). Every micro-batch loss is
// sum(CE over supervised positions) / (supervised positions in the whole window, all ranks), so a
// window equals one concatenated batch and rank gradients add up.
#pragma once

#include <memory>

#include <torch/types.h>

#include "model/simple_draft.h"
#include "objectives/objective.h"

namespace dspine::objectives {

class CeObjective final : public Objective {
 public:
  // lm_head: the target's frozen [V, H] head (kept out of the trainable module).
  CeObjective(model::SimpleDraft model, torch::Tensor lm_head);
  std::string name() const override { return "ce"; }
  std::string on_fresh_start(const std::string& init_from) override;
  void begin_window(const std::vector<data::DraftBatch>& micro_batches,
                    StepContext& context) override;
  MicroStepResult micro_step(const data::DraftBatch& batch, int64_t index,
                             StepContext& context) override;
  std::map<std::string, double> end_window(StepContext& context) override;
  std::map<std::string, double> evaluate(const data::DraftBatch& batch,
                                         StepContext& context) override;

 private:
  struct Terms {
    torch::Tensor ce_sum;  // differentiable
    torch::Tensor stats;   // [4] detached: ce_sum, correct, teacher_agree, l1_sum
    int64_t tokens = 0;
  };
  Terms compute(const data::DraftBatch& batch);
  std::map<std::string, double> reduce_stats(torch::Tensor stats, double tokens,
                                             StepContext& context) const;

  model::SimpleDraft model_;
  torch::Tensor lm_head_;
  double window_tokens_ = 0;   // global supervised positions of the current window
  torch::Tensor window_stats_;
  int64_t window_micro_steps_ = 0;
  int64_t window_size_ = 0;
};

}  // namespace dspine::objectives
