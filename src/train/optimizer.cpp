#include "train/optimizer.h"

#include <torch/torch.h>

#include "core/error.h"

namespace dspine::train {

MasterAdamW::MasterAdamW(torch::nn::Module& module, const core::TrainingConfig& config)
    : max_grad_norm_(config.max_grad_norm) {
  std::vector<torch::Tensor> masters;
  for (const auto& item : module.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    auto master = item.value().detach().to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
    slots_.push_back({item.key(), item.value(), master});
    masters.push_back(master);
  }
  if (slots_.empty()) fail("optimizer: the model has no trainable parameters");
  adamw_ = std::make_unique<torch::optim::AdamW>(
      masters, torch::optim::AdamWOptions(config.learning_rate)
                   .betas(std::make_tuple(config.adam_beta1, config.adam_beta2))
                   .eps(config.adam_eps)
                   .weight_decay(config.weight_decay));
}

void MasterAdamW::zero_grad() {
  for (auto& slot : slots_) slot.parameter.mutable_grad() = torch::Tensor();
}

double MasterAdamW::step(double lr) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (auto& slot : slots_) {
    const auto& grad = slot.parameter.grad();
    slot.master.mutable_grad() =
        grad.defined() ? grad.to(torch::kFloat, false, true) : torch::zeros_like(slot.master);
    grads.push_back(slot.master.grad());
  }
  // min(max_norm / (norm + 1e-6), 1), as torch.nn.utils.clip_grad_norm_ and the reference.
  const double norm = torch::linalg_vector_norm(
                          torch::stack(torch::_foreach_norm(grads)), 2, c10::nullopt, false,
                          torch::kDouble)
                          .item<double>();
  if (!std::isfinite(norm)) fail("optimizer step {}: gradient norm is {}", steps_, norm);
  if (max_grad_norm_ > 0) {
    const double coefficient = std::min(max_grad_norm_ / (norm + 1e-6), 1.0);
    if (coefficient < 1.0) torch::_foreach_mul_(grads, coefficient);
  }
  for (auto& group : adamw_->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
  adamw_->step();
  for (auto& slot : slots_) slot.parameter.copy_(slot.master);
  ++steps_;
  return norm;
}

core::NamedTensors MasterAdamW::state() const {
  core::NamedTensors tensors;
  tensors.emplace_back("steps", torch::tensor({steps_}, torch::kLong));
  const auto& states = adamw_->state();
  for (const auto& slot : slots_) {
    tensors.emplace_back("master." + slot.name, slot.master);
    auto found = states.find(slot.master.unsafeGetTensorImpl());
    if (found == states.end()) continue;  // no step taken yet
    const auto& adam = static_cast<const torch::optim::AdamWParamState&>(*found->second);
    tensors.emplace_back("exp_avg." + slot.name, adam.exp_avg());
    tensors.emplace_back("exp_avg_sq." + slot.name, adam.exp_avg_sq());
    tensors.emplace_back("step." + slot.name, torch::tensor({adam.step()}, torch::kLong));
  }
  return tensors;
}

void MasterAdamW::load_state(const core::SafetensorsFile& file) {
  torch::NoGradGuard no_grad;
  steps_ = file.at("steps").item<int64_t>();
  auto& states = adamw_->state();
  for (auto& slot : slots_) {
    const auto& master = file.at("master." + slot.name);
    if (!master.sizes().equals(slot.master.sizes())) {
      fail("{}: master.{} has shape {}, the model expects {}", file.path, slot.name,
           c10::str(master.sizes()), c10::str(slot.master.sizes()));
    }
    slot.master.copy_(master);
    slot.parameter.copy_(slot.master);
    states.erase(slot.master.unsafeGetTensorImpl());
    if (!file.contains("exp_avg." + slot.name)) continue;
    auto adam = std::make_unique<torch::optim::AdamWParamState>();
    adam->step(file.at("step." + slot.name).item<int64_t>());
    adam->exp_avg(file.at("exp_avg." + slot.name).to(slot.master.device(), torch::kFloat, false, true));
    adam->exp_avg_sq(
        file.at("exp_avg_sq." + slot.name).to(slot.master.device(), torch::kFloat, false, true));
    states[slot.master.unsafeGetTensorImpl()] = std::move(adam);
  }
}

}  // namespace dspine::train
