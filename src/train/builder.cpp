#include "train/builder.h"

#include "train/objective_registry.h"

namespace dspine::train {

BuiltModel build_model(const core::Config& config, const data::BatchSource& source,
                       torch::Device device, torch::Dtype dtype) {
  return find_objective(config).build(config, source, device, dtype);
}

}  // namespace dspine::train
