#include "train/optimizer.h"

#include <cmath>
#include <optional>

#include <ATen/ops/_fused_adamw.h>
#include <torch/torch.h>

#include "core/error.h"
#include "ops/master_adamw_ops.h"

namespace dspine::train {
namespace {


// The whole flat unit padded with zeros to a multiple of `world`.
torch::Tensor padded_to(const torch::Tensor& flat, int64_t world) {
  const int64_t padded = (flat.numel() + world - 1) / world * world;
  return padded == flat.numel() ? flat : torch::constant_pad_nd(flat, {0, padded - flat.numel()});
}

}  // namespace

MasterAdamW::MasterAdamW(dist::ShardedParameters& sharded, const core::TrainingConfig& config,
                         bool fused)
    : sharded_(sharded), max_grad_norm_(config.max_grad_norm), fused_(fused) {
  std::vector<torch::Tensor> masters;
  for (auto& unit : sharded_.units()) masters.push_back(unit.master());
  adamw_ = std::make_unique<torch::optim::AdamW>(
      masters, torch::optim::AdamWOptions(config.learning_rate)
                   .betas(std::make_tuple(config.adam_beta1, config.adam_beta2))
                   .eps(config.adam_eps)
                   .weight_decay(config.weight_decay));
}

void MasterAdamW::zero_grad() {
  sharded_.zero_grad();
  squared_norm_ = torch::Tensor();
}

void MasterAdamW::start_gradient_norm() {
  torch::NoGradGuard no_grad;
  sharded_.finish_gradient_sync();
  std::vector<torch::Tensor> grads;
  for (auto& unit : sharded_.units()) grads.push_back(unit.gradient());
  // The squares are summed over every rank's slices (padding is zero). A NaN or inf in any rank's
  // gradient reaches every rank: through the gradient reduce, and through this sum. Norms in fp32
  // whatever the gradient's dtype (a model-dtype gradient that nothing reduces).
  squared_norm_ =
      torch::stack(at::_foreach_norm(grads, 2, at::kFloat)).to(torch::kDouble).square().sum();
}

double MasterAdamW::gradient_norm() {
  if (!squared_norm_.defined()) start_gradient_norm();
  const double local = squared_norm_.item<double>();
  squared_norm_ = torch::Tensor();
  return std::sqrt(sharded_.sum_over_shards(local));
}

void MasterAdamW::step(double lr, double norm) {
  if (!std::isfinite(norm)) fail("optimizer step {}: gradient norm is {}", steps_, norm);
  torch::NoGradGuard no_grad;
  // min(max_norm / (norm + 1e-6), 1), as torch.nn.utils.clip_grad_norm_ and the reference.
  const double coefficient =
      max_grad_norm_ > 0 ? std::min(max_grad_norm_ / (norm + 1e-6), 1.0) : 1.0;
  for (auto& group : adamw_->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
  std::vector<bool> weights_written(sharded_.units().size(), false);
  if (fused_) {
    weights_written = fused_step(lr, coefficient);
  } else {
    std::vector<torch::Tensor> grads;
    for (auto& unit : sharded_.units()) {
      // Under none the reduced gradient is the whole (unpadded) unit, as is the master; a
      // model-dtype gradient (nothing reduced) is widened for torch::optim::AdamW.
      unit.master().mutable_grad() = unit.gradient().to(torch::kFloat);
      grads.push_back(unit.master().grad());
    }
    if (coefficient < 1.0) torch::_foreach_mul_(grads, coefficient);
    adamw_->step();
  }
  auto& units = sharded_.units();
  for (size_t u = 0; u < units.size(); ++u) {
    if (!weights_written[u]) units[u].publish_master();
  }
  ++steps_;
}

torch::optim::AdamWParamState& MasterAdamW::next_step_state(const torch::Tensor& master) {
  auto& slot = adamw_->state()[master.unsafeGetTensorImpl()];
  if (!slot) {  // the first step creates the state as torch::optim::AdamW does
    auto created = std::make_unique<torch::optim::AdamWParamState>();
    created->exp_avg(torch::zeros_like(master, torch::MemoryFormat::Preserve));
    created->exp_avg_sq(torch::zeros_like(master, torch::MemoryFormat::Preserve));
    slot = std::move(created);
  }
  auto& adam = static_cast<torch::optim::AdamWParamState&>(*slot);
  adam.step(adam.step() + 1);
  return adam;
}

std::vector<bool> MasterAdamW::fused_step(double lr, double clip_coefficient) {
  auto& units = sharded_.units();
  std::vector<bool> weights_written(units.size(), false);
  if (units.empty()) return weights_written;  // nothing trainable, as adamw_->step() would do
  const auto& options =
      static_cast<const torch::optim::AdamWOptions&>(adamw_->param_groups().front().options());
  const auto [beta1, beta2] = options.betas();
  if (units.front().master().is_cuda()) {
    // The project's kernel (ATen's arithmetic, bitwise): it reads a bf16 gradient as it is and
    // writes a whole unit's model weights in the same pass (docs/kernels.md, "Optimizer step
    // (AdamW)").
    for (size_t u = 0; u < units.size(); ++u) {
      auto& master = units[u].master();
      auto& adam = next_step_state(master);
      const ops::AdamWStep step{
          lr, beta1, beta2, options.weight_decay(), options.eps(), adam.step(), clip_coefficient};
      const auto weights = units[u].whole_weights();
      ops::master_adamw_step(master, units[u].gradient(), adam.exp_avg(), adam.exp_avg_sq(),
                             weights, step);
      weights_written[u] = weights.defined();
    }
    return weights_written;
  }
  // On the CPU: ATen's fused multi-tensor AdamW kernel.
  std::vector<torch::Tensor> masters, grads, exp_avgs, exp_avg_sqs, step_counts;
  for (auto& unit : units) {
    auto& master = unit.master();
    auto& adam = next_step_state(master);
    masters.push_back(master);
    grads.push_back(unit.gradient().to(torch::kFloat));
    exp_avgs.push_back(adam.exp_avg());
    exp_avg_sqs.push_back(adam.exp_avg_sq());
    // The kernel reads the incremented count from an fp32 scalar (exact below 2^24).
    step_counts.push_back(torch::full({}, static_cast<double>(adam.step()), master.options()));
  }
  // The kernel divides the gradients by grad_scale (as AMP's unscale), saving the clip's pass.
  std::optional<torch::Tensor> grad_scale;
  if (clip_coefficient < 1.0) {
    grad_scale = torch::full({1}, 1.0 / clip_coefficient, masters.front().options());
  }
  at::_fused_adamw_(masters, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, step_counts,
                    lr, beta1, beta2, options.weight_decay(), options.eps(), /*amsgrad=*/false,
                    /*maximize=*/false, grad_scale);
  return weights_written;
}

std::string MasterAdamW::first_nonfinite_unit() const {
  for (const auto& unit : sharded_.units()) {
    if (!unit.gradient().isfinite().all().item<bool>()) return unit.name();
  }
  return "";
}

core::NamedTensors MasterAdamW::state() const {
  const int world = sharded_.comm().world_size();
  const int rank = sharded_.comm().rank();
  // Slice `rank` of a unit's flat state in the world-padded layout every mode saves.
  auto saved_slice = [&](const torch::Tensor& owned) {
    if (sharded_.shards_state()) return owned;
    const int64_t shard = padded_to(owned, world).numel() / world;
    return padded_to(owned, world).narrow(0, rank * shard, shard).clone();
  };
  core::NamedTensors tensors;
  tensors.emplace_back("steps", torch::tensor({steps_}, torch::kLong));
  const auto& states = adamw_->state();
  for (auto& unit : sharded_.units()) {
    const auto& master = unit.master();
    tensors.emplace_back("master." + unit.name(), saved_slice(master));
    auto found = states.find(master.unsafeGetTensorImpl());
    if (found == states.end()) continue;  // no step taken yet
    const auto& adam = static_cast<const torch::optim::AdamWParamState&>(*found->second);
    tensors.emplace_back("exp_avg." + unit.name(), saved_slice(adam.exp_avg()));
    tensors.emplace_back("exp_avg_sq." + unit.name(), saved_slice(adam.exp_avg_sq()));
    tensors.emplace_back("step." + unit.name(), torch::tensor({adam.step()}, torch::kLong));
  }
  return tensors;
}

void MasterAdamW::load_state(const std::vector<core::SafetensorsFile>& files, int saved_world) {
  if (files.empty()) fail("optimizer state: no shard files to load");
  torch::NoGradGuard no_grad;
  const int world = sharded_.comm().world_size();
  const bool sharded = sharded_.shards_state();
  // Same world and sharded: the one file given is this rank's own slice, nothing to reshard.
  const bool own_slice = sharded && saved_world == world && files.size() == 1;
  // The whole unpadded flat tensor `key` of a unit, from every saved slice in rank order.
  auto whole = [&](const dist::ShardedUnit& unit, const std::string& key) {
    std::vector<torch::Tensor> slices;
    for (const auto& file : files) slices.push_back(file.at(key).reshape({-1}));
    auto flat = torch::cat(slices);
    if (flat.numel() < unit.numel()) {
      fail("{}: {} holds {} elements over {} shard files, unit {} has {} (not this model?)",
           files.front().path, key, flat.numel(), files.size(), unit.name(), unit.numel());
    }
    return flat.narrow(0, 0, unit.numel());
  };
  auto owned = [&](dist::ShardedUnit& unit, const std::string& key) {
    if (own_slice) {
      const auto& slice = files.front().at(key);
      if (slice.numel() != unit.shard_numel()) {
        fail("{}: {} has {} elements, this rank's slice of unit {} has {}", files.front().path,
             key, slice.numel(), unit.name(), unit.shard_numel());
      }
      return slice.to(unit.master().device(), torch::kFloat, false, true);
    }
    auto flat = whole(unit, key);
    if (sharded) flat = padded_to(flat, world).narrow(0, unit.shard_offset(), unit.shard_numel());
    return flat.to(unit.master().device(), torch::kFloat, false, true);
  };
  steps_ = files.front().at("steps").item<int64_t>();
  auto& states = adamw_->state();
  for (auto& unit : sharded_.units()) {
    unit.master().copy_(owned(unit, "master." + unit.name()));
    states.erase(unit.master().unsafeGetTensorImpl());
    if (!files.front().contains("exp_avg." + unit.name())) continue;
    auto adam = std::make_unique<torch::optim::AdamWParamState>();
    adam->step(files.front().at("step." + unit.name()).item<int64_t>());
    adam->exp_avg(owned(unit, "exp_avg." + unit.name()));
    adam->exp_avg_sq(owned(unit, "exp_avg_sq." + unit.name()));
    states[unit.master().unsafeGetTensorImpl()] = std::move(adam);
  }
  sharded_.publish_masters();
}

}  // namespace dspine::train
