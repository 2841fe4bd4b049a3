#include "train/config_diff.h"

#include <cstdint>
#include <map>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "train/run_config.h"

namespace dspine::train {
namespace {

// Keys that fix parameter shapes or the data stream, which the saved state depends on.
bool must_stay(const std::string& key) {
  for (const char* prefix : {"model.", "data.synthetic.", "data.target."}) {
    if (key.rfind(prefix, 0) == 0) return true;
  }
  for (const char* fixed : {"data.seq_len", "data.source", "data.shards_dir", "data.samples",
                            "data.specforge_dir", "training.batch_size",
                            "training.accumulation_steps", "training.dtype", "training.seed",
                            "objective.name"}) {
    if (key == fixed) return true;
  }
  return false;
}

// A saved integer, or -1 when the text is none.
int64_t integer_or_none(const std::string& text) {
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    return -1;
  }
}

std::string listed(const std::vector<ConfigChange>& changes) {
  std::string text;
  for (const auto& change : changes) {
    text += fmt::format("{}{}: {} -> {}", text.empty() ? "" : "; ", change.key, change.saved,
                        change.now);
  }
  return text;
}

}  // namespace

std::vector<ConfigChange> config_changes(const core::Config& saved, const core::Config& now) {
  const auto saved_values = core::setting_values(saved), now_values = core::setting_values(now);
  std::map<std::string, ConfigChange> changes;
  for (const auto& [key, value] : saved_values) {
    const auto other = now_values.find(key);
    if (other == now_values.end()) {
      changes[key] = {key, value, "(absent)"};
    } else if (other->second != value) {
      changes[key] = {key, value, other->second};
    }
  }
  for (const auto& [key, value] : now_values) {
    if (!saved_values.count(key)) changes[key] = {key, "(absent)", value};
  }
  changes.erase("checkpoint.resume");
  std::vector<ConfigChange> sorted;
  for (auto& item : changes) sorted.push_back(std::move(item.second));
  return sorted;
}

void check_resume_config(const std::string& checkpoint, const nlohmann::json& trainer_state,
                         const core::Config& config, int saved_world_size, int world_size,
                         bool leader) {
  const auto saved = trainer_state.find("config");
  if (saved == trainer_state.end() || !saved->is_string()) return;
  // The saved text read as this version reads a configuration: keys it no longer has are errors,
  // keys it added take their defaults on both sides.
  const core::Config saved_config =
      parse_run_config(saved->get<std::string>(), checkpoint + "/trainer_state.json (config)");
  std::vector<ConfigChange> refused, allowed;
  for (auto& change : config_changes(saved_config, config)) {
    // A key only one side has is a newer or older version's key at its default: allowed.
    bool refuse = must_stay(change.key) && change.saved != "(absent)" && change.now != "(absent)";
    if (refuse && change.key == "training.batch_size") {
      refuse = integer_or_none(change.saved) * saved_world_size !=
               config.training.batch_size * world_size;
    }
    (refuse ? refused : allowed).push_back(std::move(change));
  }
  if (!refused.empty()) {
    fail("cannot resume from {}: the configuration changes keys the checkpoint depends on "
         "(parameter shapes or the data stream): {}. Restore them, or start a new run in another "
         "checkpoint.dir",
         checkpoint, listed(refused));
  }
  if (leader && !allowed.empty()) {
    log::warn("resuming from {} with a changed configuration: {}", checkpoint, listed(allowed));
  }
}

}  // namespace dspine::train
