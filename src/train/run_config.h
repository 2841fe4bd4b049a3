// A run's configuration as every tool reads it: core's sections with the maps of the draft
// architectures (model.<name>) and the objectives (objective.<name>), each read, checked and held
// typed by core::parse_config (core/settings.h).
#pragma once

#include <string>
#include <vector>

#include "core/config.h"

namespace dspine::train {

// The architectures' maps, then the objectives', in registry order.
const core::SectionCatalog& run_catalog();

// core::parse_config / core::load_config with run_catalog().
core::Config parse_run_config(const std::string& yaml_text, const std::string& source,
                              const std::vector<std::string>& overrides = {});
core::Config load_run_config(const std::string& path,
                             const std::vector<std::string>& overrides = {});

}  // namespace dspine::train
