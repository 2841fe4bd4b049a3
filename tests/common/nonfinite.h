// Fault injection for the trainer's non-finite handling (training.on_nonfinite): a NaN in one
// micro-batch, and a record of which steps changed the weights.
#pragma once

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "data/batch.h"
#include "train/trainer.h"

namespace dspine::testing {

// Fills the hidden states of micro-batch `micro` of step `step` (0-based) with NaN.
inline train::Trainer::BatchHook nan_at(int64_t step, int64_t micro) {
  return [=](int64_t s, int64_t m, data::DraftBatch& batch) {
    if (s == step && m == micro) batch.hidden_states = torch::full_like(batch.hidden_states, NAN);
  };
}

inline std::map<std::string, torch::Tensor> weights_of(torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : module.named_parameters()) out[item.key()] = item.value().clone();
  return out;
}

inline bool same_weights(const std::map<std::string, torch::Tensor>& a,
                         const std::map<std::string, torch::Tensor>& b) {
  for (const auto& [name, tensor] : a) {
    if (!torch::equal(tensor, b.at(name))) return false;
  }
  return a.size() == b.size();
}

// Records, for every step the trainer runs, the weights it started from and whether the step
// changed them. zero3 frees the weights between units: use it with none or zero2.
class StepRecorder {
 public:
  explicit StepRecorder(train::Trainer& trainer) {
    trainer.set_phase_hook([this, &trainer](const std::string& phase) {
      if (phase == "prepass") before.push_back(weights_of(trainer.module()));
      if (phase == "end") {
        changed.push_back(!same_weights(before.back(), weights_of(trainer.module())));
      }
    });
  }
  std::vector<std::map<std::string, torch::Tensor>> before;  // weights at each step's start
  std::vector<bool> changed;
};

}  // namespace dspine::testing
