// Reading an objective's own settings, the map `objective.<section>` that parse_config keeps as
// raw text (core does not know which objectives exist). The checks and messages are core's: type
// errors, "did you mean" for unknown keys, range errors, all naming the full key.
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
};

// Reads config.objective.sections[section] (absent = all defaults) into the targets: type checks
// as for every other key, unknown keys get "did you mean" over `keys`; errors name the full key
// ("config error in <source>: objective.gspo.grup_size: unknown key in objective.gspo; did you
// mean objective.gspo.group_size?").
void read_objective_section(const Config& config, const std::string& section,
                            const std::vector<SettingKey>& keys);

// Range errors in the same format as core's:
// "config error in <source>: <key> = <value> is out of range; allowed: <allowed>".
[[noreturn]] void objective_range_error(const Config& config, const std::string& key,
                                        const std::string& value, const std::string& allowed);

// For the registry's own checks of objective.name and the section names.
// The closest of `candidates` to `name` when close enough to suggest, else "".
std::string closest_name(const std::string& name, const std::vector<std::string>& candidates);
// "config error in <source>: objective.<section>: unknown key in objective; did you mean ...?",
// the keys of the objective map being `name` and one section per entry of `objectives`.
[[noreturn]] void unknown_objective_section_error(const Config& config, const std::string& section,
                                                  const std::vector<std::string>& objectives);

}  // namespace dspine::core
