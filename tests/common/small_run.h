// Small, fast trainer configurations for CPU tests: the simple draft, and the embedded tiny DSpine
// configuration, on the synthetic target.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "core/config.h"
#include "train/run_config.h"

namespace dspine::testing {

inline core::Config small_run_config(const std::filesystem::path& dir, int64_t total_steps,
                                     int64_t rows = 2) {
  core::Config config = train::load_run_config("");
  config.model.architecture = "simple";
  config.objective.name = "ce";
  config.model.hidden_size = 32;
  config.model.intermediate_size = 64;
  config.model.vocab_size = 64;
  config.data.seq_len = 24;
  config.training.batch_size = rows;
  config.training.accumulation_steps = 2;
  config.training.total_steps = total_steps;
  config.training.device = dspine::core::Device::kCpu;
  config.checkpoint.dir = (dir / "checkpoints").string();
  config.checkpoint.save_every = 0;
  config.checkpoint.resume = "none";
  config.logging.metrics_file = (dir / "metrics.jsonl").string();
  config.logging.progress = dspine::core::ProgressMode::kOff;
  config.logging.level = dspine::core::LogLevel::kWarn;
  return config;
}

// The embedded tiny DSpine configuration (configs/tiny.yaml), checkpoints under `dir`, quiet, no
// metrics file.
inline core::Config tiny_dspine_run_config(const std::filesystem::path& dir, int64_t total_steps,
                                           const std::vector<std::string>& overrides = {}) {
  core::Config config = train::load_run_config("", overrides);
  config.training.total_steps = total_steps;
  config.checkpoint.dir = (dir / "checkpoints").string();
  config.checkpoint.resume = "none";
  config.logging.metrics_file = "";
  config.logging.progress = dspine::core::ProgressMode::kOff;
  config.logging.level = dspine::core::LogLevel::kWarn;
  return config;
}

}  // namespace dspine::testing
