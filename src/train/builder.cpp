#include "train/builder.h"

#include <torch/torch.h>

#include "core/error.h"
#include "model/simple_draft.h"
#include "objectives/ce_objective.h"
#include "objectives/dspine_objective.h"
#include "objectives/gspo_objective.h"

namespace dspine::train {
namespace {

// Casts parameters only: buffers such as DSpine's transfer codes stay in their own dtype.
void cast_parameters(torch::nn::Module& module, torch::Device device, torch::Dtype dtype) {
  torch::NoGradGuard no_grad;
  module.to(device);
  for (auto& parameter : module.parameters()) parameter.set_data(parameter.to(dtype));
}

nlohmann::json simple_hf_config(const core::ModelConfig& model) {
  return {{"architectures", {"SimpleDraftModel"}},
          {"model_type", "dspine-simple"},
          {"hidden_size", model.hidden_size},
          {"intermediate_size", model.intermediate_size},
          {"num_hidden_layers", model.num_hidden_layers},
          {"vocab_size", model.vocab_size},
          {"rms_norm_eps", model.rms_norm_eps},
          {"target_layer_ids", model.target_layer_ids}};
}

BuiltModel build_simple(const core::Config& config, const data::BatchSource& source,
                        torch::Device device, torch::Dtype dtype) {
  if (config.objective.name != "ce") {
    fail("objective.name = {} needs model.architecture: dspine; the simple draft trains with ce",
         config.objective.name);
  }
  const bool fused = model::use_fused_kernels(
      model::parse_fused_kernels(config.model.fused_kernels), device);
  model::SimpleDraft draft(config.model, fused);
  cast_parameters(*draft, device, dtype);
  auto lm_head = source.lm_head().to(device, dtype);
  BuiltModel built;
  built.module = draft.ptr();
  built.objective = std::make_unique<objectives::CeObjective>(draft, lm_head);
  built.hf_config = simple_hf_config(config.model);
  return built;
}

BuiltModel build_dspine(const core::Config& config, const data::BatchSource& source,
                        torch::Device device, torch::Dtype dtype) {
  if (config.objective.name == "gspo") {
    auto objective = objectives::make_gspo_objective(config, objectives::GspoSettings{},
                                                     source.embed_tokens(), source.lm_head(),
                                                     device, dtype);
    BuiltModel built;
    built.module = objective->module();
    built.hf_config = objective->hf_config();
    built.objective = std::move(objective);
    return built;
  }
  if (config.objective.name != "dspine") {
    fail("objective.name = {} does not train model.architecture: dspine; use objective.name: dspine",
         config.objective.name);
  }
  auto objective = objectives::make_dspine_objective(config, source.embed_tokens(),
                                                     source.lm_head(), device, dtype);
  BuiltModel built;
  built.module = objective->module();
  built.hf_config = objective->hf_config();
  built.objective = std::move(objective);
  return built;
}

}  // namespace

BuiltModel build_model(const core::Config& config, const data::BatchSource& source,
                       torch::Device device, torch::Dtype dtype) {
  if (config.model.architecture == "simple") return build_simple(config, source, device, dtype);
  if (config.model.architecture == "dspine") return build_dspine(config, source, device, dtype);
  fail("model.architecture = {} is not available in this build", config.model.architecture);
}

}  // namespace dspine::train
