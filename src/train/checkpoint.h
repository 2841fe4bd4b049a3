// Checkpoints: one directory per save (root/step-000100/) written under a temporary name and
// renamed when complete, so a directory named step-* is always whole. Holds the model weights
// (model.safetensors with the reference state-dict keys), config.json, optimizer.safetensors,
// rng.safetensors and trainer_state.json (step, data cursor, run configuration).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"

namespace dspine::train {

struct CheckpointContents {
  core::NamedTensors model;
  nlohmann::json model_config;  // config.json (HF-style)
  core::NamedTensors optimizer;
  core::NamedTensors rng;
  nlohmann::json trainer_state;
};

struct LoadedCheckpoint {
  std::string path;
  core::SafetensorsFile model, optimizer, rng;
  nlohmann::json model_config, trainer_state;
};

class CheckpointManager {
 public:
  // keep_last: complete checkpoints kept after each save (0 = all).
  CheckpointManager(std::string root, int64_t keep_last);

  // Writes root/step-<step>; calls after_file(name) after each file (tests use it to interrupt a
  // save). Refuses to replace an existing checkpoint. Returns the final directory.
  std::string save(int64_t step, const CheckpointContents& contents,
                   const std::function<void(const std::string&)>& after_file = {});

  // Complete checkpoints, oldest first.
  std::vector<std::string> list() const;
  // The newest complete checkpoint, or "" when there is none.
  std::string latest() const;
  // Removes what interrupted saves or prunes left behind (.tmp-* / .trash-* directories).
  void remove_incomplete() const;

 private:
  void prune() const;
  std::string root_;
  int64_t keep_last_;
};

// Reads a checkpoint directory; a missing or malformed file is an error naming it.
LoadedCheckpoint load_checkpoint(const std::string& directory);

// "step-000100" for 100.
std::string checkpoint_name(int64_t step);

}  // namespace dspine::train
