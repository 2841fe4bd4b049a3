#include "train/builder.h"

#include "train/objective_registry.h"

namespace dspine::train {

BuiltModel build_model(const core::Config& config, const ResolvedObjective& objective,
                       const data::BatchSource& source, torch::Device device, torch::Dtype dtype) {
  BuiltModel built =
      objective.entry->build(config, *objective.settings, objective.draft, source, device, dtype);
  built.settings = objective.settings;
  built.draft = objective.draft;
  return built;
}

}  // namespace dspine::train
