// The objectives the trainer can run, one entry each: its name (objective.name and the map
// objective.<name> holding its settings), the draft architecture it trains (model.architecture),
// how its settings are parsed and how draft + objective are built. Adding an objective is one
// objective file in src/objectives/ plus one entry in objective_registry.cpp.
//
// An objective's map objective.<name>, like its draft's model.<architecture>
// (model/draft_registry.h), is declared with its settings (core/settings.h) and read and checked
// by parse_config with the run catalog (train/run_config.h), once; resolve_run hands the typed
// settings to the build, and the built objective keeps them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "core/config.h"
#include "data/batch_source.h"
#include "model/draft_registry.h"
#include "objectives/dspine_settings.h"
#include "train/built_model.h"

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
  core::SectionType section;  // the map objective.<name>, for the catalog parse_config reads
  // Its settings (objective.<name>, and any other objective map it needs) in a parsed
  // configuration.
  std::shared_ptr<const ObjectiveSettings> (*settings)(const core::Config& config);
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

// The entry of objective.name with its settings and its draft's, after checking the two
// registry rules the parser cannot (objective.name names an objective, which trains
// model.architecture). Throws config errors naming the key.
ResolvedObjective resolve_run(const core::Config& config);

// Draft and objective of an objective already resolved from `config` (resolve_run). Parameters are
// created in `dtype`; buffers keep their own dtype (e.g. fp32 transfer codes).
BuiltModel build_model(const core::Config& config, const ResolvedObjective& objective,
                       const data::BatchSource& source, torch::Device device, torch::Dtype dtype);

// Every registered objective.name, in registry order.
std::vector<std::string> objective_names();

// The maps objective.<name> of every objective, in registry order, for parse_config's catalog.
core::SectionCatalog objective_sections();

}  // namespace dspine::train
