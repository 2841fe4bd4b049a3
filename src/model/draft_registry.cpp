#include "model/draft_registry.h"

#include "core/config_section.h"
#include "model/dspine_config.h"

namespace dspine::model {
namespace {

// The simple draft has no settings: any key under model.simple is unknown.
struct SimpleSettings final : DraftSettings {};

std::shared_ptr<const DraftSettings> parse_simple(const core::Config& config) {
  core::read_section(config, "model.simple", {});
  return std::make_shared<SimpleSettings>();
}

struct DSpineSettings final : DraftSettings {
  DSpineConfig dspine;  // model.dspine
  std::string yaml() const override { return dspine_yaml(dspine); }
};

std::shared_ptr<const DraftSettings> parse_dspine(const core::Config& config) {
  auto settings = std::make_shared<DSpineSettings>();
  settings->dspine = read_dspine_config(config);
  return settings;
}

// One entry per name of core::architecture_names(), in its order (a model test checks both).
const std::vector<DraftEntry>& registry() {
  static const std::vector<DraftEntry> entries = {
      {"simple", parse_simple},
      {"dspine", parse_dspine},
  };
  return entries;
}

}  // namespace

std::vector<std::string> draft_names() {
  std::vector<std::string> names;
  for (const DraftEntry& entry : registry()) names.push_back(entry.name);
  return names;
}

void resolve_drafts(core::Config& config) {
  for (const DraftEntry& entry : registry()) {
    const std::string yaml = entry.parse(config)->yaml();
    if (yaml.empty()) {
      config.model.sections.erase(entry.name);
    } else {
      config.model.sections[entry.name] = yaml;
    }
  }
}

std::vector<core::KeyFacts> draft_key_facts() {
  std::vector<core::KeyFacts> facts;
  for (const DraftEntry& entry : registry()) {
    // The default architecture: the rules that depend on the draft's sizes apply to their own
    // architecture only, and the reference's defaults exceed the default sizes.
    const core::Config defaults;
    core::SettingsRecorder recorder;
    entry.parse(defaults);
    facts.insert(facts.end(), recorder.facts().begin(), recorder.facts().end());
  }
  return facts;
}

}  // namespace dspine::model
