// The declarations of core's sections (config_settings.cpp), for config.cpp.
#pragma once

#include "core/config.h"
#include "core/settings.h"

namespace dspine::core {

// model.architecture's choices; each names a map model.<name> (model/draft_registry.h).
const std::vector<std::string>& architecture_choices();

// Every key of core's sections with full keys, in to_yaml order; targets and rules refer to `c`.
Settings core_settings(Config& c);

}  // namespace dspine::core
