// Errors about a parsed configuration raised outside the parser (the objective registry's checks
// of objective.name against model.architecture), in the parser's format.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"

namespace dspine::core {

// "config error in <source>: <key> = <value> is out of range; allowed: <allowed>", plus the
// --set override the key came from.
[[noreturn]] void range_error(const Config& config, const std::string& key,
                              const std::string& value, const std::string& allowed);

// The closest of `candidates` to `name` when close enough to suggest, else "".
std::string closest_name(const std::string& name, const std::vector<std::string>& candidates);

}  // namespace dspine::core
