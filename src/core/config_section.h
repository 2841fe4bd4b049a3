// Reading a map that parse_config keeps as raw text for its owner to read, because core does not
// know its keys: an objective's settings, `objective.<name>` (core does not know which objectives
// exist), and a draft architecture's, `model.<architecture>` (model/draft_registry.h). The checks
// and messages are core's: type errors, "did you mean" for unknown keys, range errors, all naming
// the full key.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "core/config.h"

namespace dspine::core {

using SettingTarget = std::variant<int64_t*, double*, std::string*, bool*, std::vector<int64_t>*>;

struct SettingKey {
  std::string name;  // leaf name inside the section, e.g. "group_size"
  SettingTarget target;
  std::vector<std::string> choices = {};  // enumeration; empty = any string
  bool accepts_bool = false;              // auto|true|false style keys
  std::string description = "";           // one line for the configuration reference
};

// Reads the kept map `map` (its full key, e.g. "objective.gspo"; absent = all defaults) into the
// targets: type checks as for every other key, unknown keys get "did you mean" over `keys`; errors
// name the full key ("config error in <source>: objective.gspo.grup_size: unknown key in
// objective.gspo; did you mean objective.gspo.group_size?"). `map` must be a kept map
// (objective.<x> or model.<architecture>). A setting given by --set ends its errors with
// "(from override '<text>')".
void read_section(const Config& config, const std::string& map,
                  const std::vector<SettingKey>& keys);

// Range errors in the same format as core's:
// "config error in <source>: <key> = <value> is out of range; allowed: <allowed>".
[[noreturn]] void objective_range_error(const Config& config, const std::string& key,
                                        const std::string& value, const std::string& allowed);

// A range check of one setting: when !ok, throws core's range error
// ("config error in <source>: <key> = <value> is out of range; allowed: <allowed>"). Either way
// `allowed` is what the configuration reference lists for the key.
void check_setting(const Config& config, const std::string& key, bool ok, const std::string& value,
                   const std::string& allowed);

// A rule of a kept map's setting in its owner's words: when !ok, throws
// "config error in <source>: <key> = <value> is out of range: <problem>" (plus the override it
// came from); either way `allowed` is what the configuration reference lists for the key.
void check_rule(const Config& config, const std::string& key, bool ok, const std::string& value,
                const std::string& allowed, const std::string& problem);

// While one is alive on a thread, read_section and check_setting on that thread also
// record each key's type, default, allowed values and description: running an objective's
// parse on a default configuration lists its settings for the reference.
class SettingsRecorder {
 public:
  SettingsRecorder();
  ~SettingsRecorder();
  SettingsRecorder(const SettingsRecorder&) = delete;
  SettingsRecorder& operator=(const SettingsRecorder&) = delete;
  const std::vector<KeyFacts>& facts() const { return facts_; }
  // Records `allowed` for `key` in the live recorder, if any (check_setting, check_rule).
  static void record_allowed(const std::string& key, const std::string& allowed);

 private:
  friend void read_section(const Config&, const std::string&, const std::vector<SettingKey>&);
  std::vector<KeyFacts> facts_;
  SettingsRecorder* previous_;
};

// For the registry's own checks of objective.name and the section names.
// The closest of `candidates` to `name` when close enough to suggest, else "".
std::string closest_name(const std::string& name, const std::vector<std::string>& candidates);
// "config error in <source>: objective.<section>: unknown key in objective; did you mean ...?",
// the keys of the objective map being `name` and one section per entry of `objectives`.
[[noreturn]] void unknown_objective_section_error(const Config& config, const std::string& section,
                                                  const std::vector<std::string>& objectives);

}  // namespace dspine::core
