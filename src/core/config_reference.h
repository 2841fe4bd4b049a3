// The configuration reference, docs/config.md: every key with its type, default, allowed values
// and a one-line description, all from the keys' declarations (core/settings.h), so the page
// cannot drift from what the parser accepts. A key without a description is an error.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"

namespace dspine::core {

// docs/config.md as Markdown: the core keys (objective.name allows `objective_names`) with the
// catalog's model.<architecture> maps closing the model section, then its objective.<name> maps.
// Throws naming a key without a description.
std::string config_reference_markdown(const std::vector<std::string>& objective_names,
                                      const SectionCatalog& catalog);

}  // namespace dspine::core
