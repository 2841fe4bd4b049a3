#include "train/run_config.h"

#include "model/draft_registry.h"
#include "train/objective_registry.h"

namespace dspine::train {

const core::SectionCatalog& run_catalog() {
  static const core::SectionCatalog catalog = [] {
    core::SectionCatalog sections = model::draft_sections();
    for (core::SectionType& type : objective_sections()) sections.push_back(std::move(type));
    return sections;
  }();
  return catalog;
}

core::Config parse_run_config(const std::string& yaml_text, const std::string& source,
                              const std::vector<std::string>& overrides) {
  return core::parse_config(yaml_text, source, overrides, run_catalog());
}

core::Config load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  return core::load_config(path, overrides, run_catalog());
}

}  // namespace dspine::train
