// Resuming with another configuration: the keys that changed since the checkpoint was saved,
// split into those a resume cannot honour (they change parameter shapes or the data stream) and
// those it can (learning rate, total steps, logging, checkpoint cadence, ...).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.h"

namespace dspine::train {

struct ConfigChange {
  std::string key;    // dotted, e.g. "training.learning_rate"
  std::string saved;  // "(absent)" when the configuration has no such key
  std::string now;
};

// The keys whose values differ between two configurations (typed values, compared as
// core::setting_values shows them), sorted; checkpoint.resume is left out (it says how to start,
// not what to train).
std::vector<ConfigChange> config_changes(const core::Config& saved, const core::Config& now);

// Checks the configuration of a resume against the one saved in `trainer_state` ("config"; a
// checkpoint without it is not checked). Throws dspine::Error naming every refused key; logs one
// warning (when `leader`) listing the other changes. training.batch_size may change when the
// global batch (batch_size × world size) stays the same: a resharding resume.
void check_resume_config(const std::string& checkpoint, const nlohmann::json& trainer_state,
                         const core::Config& config, int saved_world_size, int world_size,
                         bool leader);

}  // namespace dspine::train
