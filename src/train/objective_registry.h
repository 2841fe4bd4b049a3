// The objectives the trainer can run, one entry each: its name (objective.name and the map
// objective.<name> holding its settings), the draft architecture it trains (model.architecture),
// how its settings are parsed and how draft + objective are built. Adding an objective is one
// objective file in src/objectives/ plus one entry in objective_registry.cpp.
//
// An objective's settings, and its draft's (model.<architecture>, model/draft_registry.h), are
// parsed once per configuration, by resolve_run or resolve_objective: the build receives them
// typed, and the built objective keeps them; nothing reads objective.<name> or model.<name>
// again.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "core/config.h"
#include "data/batch_source.h"
#include "model/draft_registry.h"
#include "objectives/dspine_settings.h"
#include "train/builder.h"

namespace dspine::train {

// An objective's settings as its entry's parse made them from the configuration's objective maps.
// Each entry has its own subclass (objective_registry.cpp); callers outside the registry only ask
// what they need through the accessors.
struct ObjectiveSettings {
  virtual ~ObjectiveSettings() = default;
  // objective.dspine as parsed, for the objectives that sample DSpine anchor blocks (dspine,
  // gspo); null for the others.
  virtual const objectives::DSpineSettings* dspine() const { return nullptr; }
};

struct ObjectiveEntry {
  std::string name;          // objective.name, and the section objective.<name>
  std::string architecture;  // the model.architecture it trains: "simple" | "dspine"
  // Reads objective.<name> (and any other objective map it needs; core/config_section.h) into
  // its settings, throwing config errors on a bad setting.
  std::shared_ptr<const ObjectiveSettings> (*parse)(const core::Config& config);
  // Draft + objective from the settings parse made of the same configuration; the draft is
  // built by `draft`'s entry, and config.json written by it.
  BuiltModel (*build)(const core::Config& config, const ObjectiveSettings& settings,
                      const model::ResolvedDraft& draft, const data::BatchSource& source,
                      torch::Device device, torch::Dtype dtype);
};

// A configuration's objective: its registry entry and its parsed settings, with the draft it
// trains (model.architecture's draft registry entry and settings).
struct ResolvedObjective {
  const ObjectiveEntry* entry = nullptr;
  std::shared_ptr<const ObjectiveSettings> settings;
  model::ResolvedDraft draft;
};

// The entry of objective.name and its settings, after checking the configuration against the
// registry: a known objective.name, the model.architecture it trains, every objective.<x> section
// naming an objective, then the draft's parse of model.<architecture> and the entry's parse of
// its own settings (the one parse of each). Throws config errors naming the key.
ResolvedObjective resolve_objective(const core::Config& config);

// What a tool does at start-up: model::resolve_drafts (every architecture's map parsed and
// written back resolved, for to_yaml), then resolve_objective with model.architecture's draft as
// resolve_drafts parsed it. Throws config errors naming the key.
ResolvedObjective resolve_run(core::Config& config);

// Every registered objective.name, in registry order.
std::vector<std::string> objective_names();

// The settings of every objective's map objective.<name> (type, default, allowed values,
// description), recorded by running each entry's parse on a default configuration.
std::vector<core::KeyFacts> objective_key_facts();

}  // namespace dspine::train
