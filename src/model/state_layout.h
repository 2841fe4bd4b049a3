// The DSpine draft's state dict as names and shapes, from its configuration alone
// (docs/model.md#state-dict-keys): what an exported model.safetensors must hold, checked without
// building the model (a recipe-size draft is gigabytes). A model test pins it to the module's own
// named_parameters() and named_buffers().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "model/dspine_config.h"

namespace dspine::model {

struct StateEntry {
  std::string name;
  std::vector<int64_t> shape;  // empty: a 0-d tensor (transfer_ready)
};

// Parameters in registration order, then the buffers transfer_codes and transfer_ready.
std::vector<StateEntry> dspine_state_layout(const DSpineModelConfig& config);

}  // namespace dspine::model
