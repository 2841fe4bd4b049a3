#include "dist/sharded_parameters.h"

#include <regex>

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include "core/error.h"

namespace dspine::dist {
namespace {

const std::regex kLayerPrefix(R"(^(layers\.[0-9]+)\.)");

std::string unit_of(const std::string& parameter) {
  std::smatch match;
  if (std::regex_search(parameter, match, kLayerPrefix)) return match[1];
  if (parameter.rfind("fc.", 0) == 0 || parameter.rfind("hidden_norm.", 0) == 0) return "context";
  return "head";
}

// Runs after autograd has accumulated a parameter's gradient into its .grad (a view into the
// unit's flat gradient, or after zero_grad a tensor of its own that the unit copies in), so the
// unit knows when its whole gradient for this backward is there.
class GradientAccumulatedHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  GradientAccumulatedHook(ShardedParameters& owner, size_t unit, size_t parameter)
      : owner_(owner), unit_(unit), parameter_(parameter) {}
  void operator()(const torch::autograd::Variable&) override {
    owner_.on_gradient_accumulated(unit_, parameter_);
  }

 private:
  ShardedParameters& owner_;
  size_t unit_, parameter_;
};

}  // namespace

std::vector<std::pair<std::string, ShardedUnit::NamedParameters>> plan_units(
    torch::nn::Module& module) {
  // Forward order: the context first, the layers in the module's (index) order, the head last.
  std::vector<std::pair<std::string, ShardedUnit::NamedParameters>> units = {{"context", {}}};
  ShardedUnit::NamedParameters head;
  for (const auto& item : module.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    const std::string unit = unit_of(item.key());
    if (unit == "context") {
      units.front().second.emplace_back(item.key(), item.value());
    } else if (unit == "head") {
      head.emplace_back(item.key(), item.value());
    } else {
      if (units.back().first != unit) units.emplace_back(unit, ShardedUnit::NamedParameters{});
      units.back().second.emplace_back(item.key(), item.value());
    }
  }
  units.emplace_back("head", std::move(head));
  std::vector<std::pair<std::string, ShardedUnit::NamedParameters>> used;
  for (auto& unit : units) {
    if (!unit.second.empty()) used.push_back(std::move(unit));
  }
  if (used.empty()) fail("sharding: the model has no trainable parameters");
  return used;
}

ShardedParameters::ShardedParameters(torch::nn::Module& module, std::shared_ptr<Communicator> comm,
                                     core::Sharding mode, bool prefetch)
    : comm_(std::move(comm)), strategy_(sharding_strategy(mode)), prefetch_(prefetch) {
  auto plan = plan_units(module);
  units_.reserve(plan.size());
  for (auto& [name, parameters] : plan) {
    units_.emplace_back(name, std::move(parameters), *comm_, strategy_);
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    const auto& parameters = units_[u].parameters();
    for (size_t p = 0; p < parameters.size(); ++p) {
      torch::autograd::impl::set_post_acc_grad_hooks(
          parameters[p].second, std::make_unique<GradientAccumulatedHook>(*this, u, p));
      hooked_.push_back(parameters[p].second);
    }
  }
  pending_gathers_.resize(units_.size());
  released_in_forward_.assign(units_.size(), false);
}

ShardedParameters::~ShardedParameters() {
  for (auto& parameter : hooked_) {
    torch::autograd::impl::set_post_acc_grad_hooks(parameter, nullptr);
  }
}

void ShardedParameters::begin_backward(bool sync) {
  sync_ = sync;
  for (auto& unit : units_) unit.reset_gradient_count();
}

void ShardedParameters::on_gradient_accumulated(size_t unit, size_t parameter) {
  if (!units_[unit].note_gradient_accumulated(parameter)) return;
  if (sync_) units_[unit].start_gradient_reduce();
  if (released_in_forward_[unit]) units_[unit].release();
}

size_t ShardedParameters::index_of(const std::string& name) const {
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u].name() == name) return u;
  }
  fail("sharding: the model announced unit {}, which holds no trainable parameter", name);
}

void ShardedParameters::make_resident(size_t unit) {
  if (pending_gathers_[unit]) {
    pending_gathers_[unit]->wait();
    pending_gathers_[unit].reset();
  }
  if (!units_[unit].resident()) units_[unit].start_gather()->wait();
}

void ShardedParameters::prefetch(size_t unit) {
  if (!prefetch_ || unit >= units_.size() || units_[unit].resident()) return;
  pending_gathers_[unit] = units_[unit].start_gather();
}

void ShardedParameters::before_unit(const std::string& name) {
  if (!strategy_.gathers_parameters_per_unit) return;
  const size_t unit = index_of(name);
  make_resident(unit);
  prefetch(unit + 1);
}

at::Tensor ShardedParameters::after_unit(const std::string& name, const at::Tensor& output) {
  if (!strategy_.gathers_parameters_per_unit) return output;
  const size_t unit = index_of(name);
  units_[unit].release();
  released_in_forward_[unit] = output.requires_grad();
  if (!output.requires_grad()) return output;
  // The gradient of the unit's output is complete just before the unit's own backward runs.
  auto hooked = output.view_as(output);
  hooked.register_hook([this, unit](const at::Tensor& grad) {
    make_resident(unit);
    if (unit > 0) prefetch(unit - 1);
    return grad;
  });
  return hooked;
}

void ShardedParameters::finish_gradient_sync() {
  for (auto& unit : units_) unit.start_gradient_reduce();
  for (auto& unit : units_) unit.finish_gradient_reduce();
}

double ShardedParameters::sum_over_shards(double local) {
  if (!strategy_.shards_state || comm_->world_size() == 1) return local;
  auto value = at::tensor({local}, at::kDouble);
  comm_->all_reduce(value, ReduceOp::kSum);
  return value.item<double>();
}

void ShardedParameters::load_masters_from_model() {
  for (auto& unit : units_) unit.load_master_from_model();
}

void ShardedParameters::publish_masters() {
  for (auto& unit : units_) unit.publish_master();
}

void ShardedParameters::zero_grad() {
  for (auto& unit : units_) unit.zero_grad();
  release_all();
}

void ShardedParameters::gather_all() {
  if (!strategy_.gathers_parameters_per_unit) return;
  for (size_t u = 0; u < units_.size(); ++u) make_resident(u);
}

void ShardedParameters::release_all() {
  for (size_t u = 0; u < units_.size(); ++u) {
    if (pending_gathers_[u]) pending_gathers_[u]->wait();
    pending_gathers_[u].reset();
    units_[u].release();
    released_in_forward_[u] = false;
  }
}

}  // namespace dspine::dist
