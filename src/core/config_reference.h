// The configuration reference, docs/config.md: every key with its type, default, allowed values
// and a one-line description. Types, defaults and allowed values come from the key table and the
// validation (core_key_facts, and the objectives' and architectures' own parses through
// SettingsRecorder); only the
// descriptions are written here, and a key without one is an error, so the page cannot drift.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"

namespace dspine::core {

// docs/config.md as Markdown: the core keys (described in config_reference.cpp; objective.name
// allows `objective_names`) with `architecture_keys` (model.<architecture>.*) closing the model
// section, and then `objective_keys`; the kept maps' keys carry their own descriptions. Throws
// naming a key without a description.
std::string config_reference_markdown(const std::vector<std::string>& objective_names,
                                      const std::vector<KeyFacts>& objective_keys,
                                      const std::vector<KeyFacts>& architecture_keys);

}  // namespace dspine::core
