#include "model/simple_draft.h"

#include <torch/torch.h>

namespace dspine::model {
namespace {

// One residual block: x + mlp(norm(x)).
class ResidualMlpImpl : public torch::nn::Module {
 public:
  ResidualMlpImpl(const core::ModelConfig& config, bool fused)
      : norm(register_module("norm", RMSNorm(config.hidden_size, config.rms_norm_eps, fused))),
        mlp(register_module("mlp",
                            SwiGLUMLP(config.hidden_size, config.intermediate_size, fused))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + mlp->forward(norm->forward(x)); }
  RMSNorm norm;
  SwiGLUMLP mlp;
};
TORCH_MODULE(ResidualMlp);

}  // namespace

SimpleDraftImpl::SimpleDraftImpl(const core::ModelConfig& config, bool fused_kernels) {
  const int64_t k = static_cast<int64_t>(config.target_layer_ids.size());
  fc = register_module("fc", torch::nn::Linear(torch::nn::LinearOptions(k * config.hidden_size,
                                                                        config.hidden_size)
                                                   .bias(false)));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    layers->push_back(ResidualMlp(config, fused_kernels));
  }
  norm = register_module("norm", RMSNorm(config.hidden_size, config.rms_norm_eps, fused_kernels));
  // Backbone init as in HF Qwen3 (normal(0, initializer_range)); norms start at 1.
  torch::NoGradGuard no_grad;
  for (auto& parameter : named_parameters()) {
    if (parameter.key().find("norm") == std::string::npos) {
      parameter.value().normal_(0.0, config.initializer_range);
    }
  }
}

void SimpleDraftImpl::set_unit_observer(std::shared_ptr<UnitObserver> observer) {
  observer_ = std::move(observer);
}

torch::Tensor SimpleDraftImpl::forward(const torch::Tensor& hidden_states) {
  auto run = [&](const std::string& unit, const auto& body) {
    if (observer_) observer_->before_unit(unit);
    auto output = body();
    return observer_ ? observer_->after_unit(unit, output) : output;
  };
  torch::Tensor x = run("context", [&] { return fc->forward(hidden_states); });
  for (size_t i = 0; i < layers->size(); ++i) {
    x = run("layers." + std::to_string(i),
            [&] { return layers[i]->as<ResidualMlpImpl>()->forward(x); });
  }
  if (observer_) observer_->before_unit("head");
  return norm->forward(x);
}

}  // namespace dspine::model
