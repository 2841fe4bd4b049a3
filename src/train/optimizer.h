// AdamW over fp32 master weights (dspine.md §2.4, the reference's BF16Optimizer): gradients of
// the (possibly bf16) model parameters are copied into fp32 masters, clipped by their global norm,
// stepped by torch::optim::AdamW, and the masters are copied back in the model dtype.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include "core/config.h"
#include "core/safetensors.h"

namespace dspine::train {

class MasterAdamW {
 public:
  MasterAdamW(torch::nn::Module& module, const core::TrainingConfig& config);

  // Global L2 norm of the model gradients (before clipping); applies clipping, one AdamW step at
  // `lr` and copies the masters back into the model. Missing gradients count as zero.
  double step(double lr);
  void zero_grad();

  // Moments and masters keyed by parameter name ("exp_avg.<name>", ...), plus the step count.
  core::NamedTensors state() const;
  // Restores state(); errors name the missing tensor.
  void load_state(const core::SafetensorsFile& file);

 private:
  struct Slot {
    std::string name;
    torch::Tensor parameter;  // the model's (trainable) parameter
    torch::Tensor master;     // fp32 copy the optimizer steps
  };
  std::vector<Slot> slots_;
  std::unique_ptr<torch::optim::AdamW> adamw_;
  double max_grad_norm_;
  int64_t steps_ = 0;
};

}  // namespace dspine::train
