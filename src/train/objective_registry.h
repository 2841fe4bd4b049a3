// The objectives the trainer can run, one entry each: its name (objective.name and the map
// objective.<name> holding its settings), the draft architecture it trains (model.architecture),
// how its settings are checked and how draft + objective are built. Adding an objective is one
// objective file in src/objectives/ plus one entry in objective_registry.cpp.
#pragma once

#include <string>
#include <vector>

#include <torch/types.h>

#include "core/config.h"
#include "data/batch_source.h"
#include "train/builder.h"

namespace dspine::train {

struct ObjectiveEntry {
  std::string name;          // objective.name, and the section objective.<name>
  std::string architecture;  // the model.architecture it trains: "simple" | "dspine"
  // Reads objective.<name> (core/config_section.h) and throws on a bad setting.
  void (*validate)(const core::Config& config);
  BuiltModel (*build)(const core::Config& config, const data::BatchSource& source,
                      torch::Device device, torch::Dtype dtype);
};

// The entry of objective.name after checking the configuration against the registry: a known
// objective.name, the model.architecture it trains, every objective.<x> section naming an
// objective, then the entry's own settings. Throws config errors naming the key.
const ObjectiveEntry& find_objective(const core::Config& config);

// Every registered objective.name, in registry order.
std::vector<std::string> objective_names();

// The settings of every objective's map objective.<name> (type, default, allowed values,
// description), read by running each entry's validation on a default configuration.
std::vector<core::KeyFacts> objective_key_facts();

}  // namespace dspine::train
