// The simplest useful draft (model.architecture: simple): project the K captured target layers to
// H, refine with residual SwiGLU blocks, and read out through the target's frozen lm_head. It
// predicts the next token of every position; the DSpine draft (dspine_*.h) is the real model.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include "core/config.h"
#include "model/norm_mlp.h"
#include "model/unit_observer.h"

namespace dspine::model {

// Units announced to a UnitObserver: "context" (fc), "layers.<i>", "head" (norm).
class SimpleDraftImpl : public torch::nn::Module, public ObservableUnits {
 public:
  SimpleDraftImpl(const core::ModelConfig& config, bool fused_kernels);
  // hidden_states [..., K*H] -> features [..., H] (the input of lm_head).
  torch::Tensor forward(const torch::Tensor& hidden_states);
  void set_unit_observer(std::shared_ptr<UnitObserver> observer) override;

  torch::nn::Linear fc{nullptr};
  torch::nn::ModuleList layers;
  RMSNorm norm{nullptr};

 private:
  std::shared_ptr<UnitObserver> observer_;
};
TORCH_MODULE(SimpleDraft);

}  // namespace dspine::model
