// zero3 sharding wraps the draft from outside: the draft announces its units (model/
// unit_observer.h) and the sharding gathers and frees them around their use.
#pragma once

#include <string>

#include "dist/sharded_parameters.h"

namespace torch::nn {
class Module;
}

namespace dspine::train {

// Under zero3, makes `module` announce its units to `sharded` (an error naming the
// architecture when the draft cannot); nothing to do under none and zero2.
void attach_sharding(torch::nn::Module& module, dist::ShardedParameters& sharded,
                     const std::string& architecture);

}  // namespace dspine::train
