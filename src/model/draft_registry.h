// The draft architectures, one entry each: its name (model.architecture, and the map
// model.<name> holding its own settings) and the parse of that map. Core keeps model.<name> as
// YAML text (core/config.h, ModelConfig::sections); the entry reads and checks it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/config.h"

namespace dspine::model {

// An architecture's settings as its entry's parse made them. Each entry has its own subclass
// (draft_registry.cpp).
struct DraftSettings {
  virtual ~DraftSettings() = default;
  // The map model.<name> with every setting resolved, as YAML text (what to_yaml writes); "" for
  // an architecture without settings.
  virtual std::string yaml() const { return ""; }
};

struct DraftEntry {
  std::string name;  // model.architecture, and the map model.<name>
  // Reads model.<name> (core/config_section.h) into the settings, throwing config errors.
  std::shared_ptr<const DraftSettings> (*parse)(const core::Config& config);
};

// Every registered model.architecture, in registry order.
std::vector<std::string> draft_names();

// Parses every architecture's map (so a bad setting fails at start-up, whichever the
// architecture) and writes each back resolved, every setting with its value: to_yaml then writes
// what the run uses (checkpoints, --print-config; resume compares them). Throws config errors.
void resolve_drafts(core::Config& config);

// The settings of every architecture's map model.<name> (type, default, allowed values,
// description), recorded by running each entry's parse on a default configuration.
std::vector<core::KeyFacts> draft_key_facts();

}  // namespace dspine::model
