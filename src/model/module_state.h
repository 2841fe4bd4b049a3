// A module's state as named tensors (parameters, then buffers: the reference state-dict keys) and
// the strict load of such a state from a safetensors file, shared by resume, GSPO's init_from and
// dspine-eval.
#pragma once

#include <string>

#include <torch/nn/module.h>

#include "core/safetensors.h"

namespace dspine::model {

core::NamedTensors module_state(torch::nn::Module& module);

// Copies every parameter and buffer from `file`, which must hold exactly those names with the
// module's shapes; errors name the file and the tensor.
void load_module_state(torch::nn::Module& module, const core::SafetensorsFile& file);

// A checkpoint directory's model.safetensors, or `path` itself when it is a file; errors name
// the path and what is missing.
std::string weights_file(const std::string& path);

}  // namespace dspine::model
