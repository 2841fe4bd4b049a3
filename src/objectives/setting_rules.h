// The range rule the objectives' settings declare (objective.dspine, objective.gspo;
// core/settings.h): the value must satisfy a predicate, and `allowed` is both what
// docs/config.md lists and what the error names.
#pragma once

#include <optional>
#include <string>

#include <fmt/format.h>

#include "core/settings.h"

namespace dspine::objectives {

// `ok(value)` must hold when the rule runs (after every key is read); otherwise
// "<key> = <value> is out of range; allowed: <allowed>", the value as fmt writes it.
template <typename T, typename Ok>
core::Rule require(const T& value, Ok ok, std::string allowed) {
  return core::rule(allowed, [&value, ok, allowed](const std::string& key) {
    std::optional<core::RuleFailure> failure;
    if (!ok(value)) failure = core::out_of_range(key, fmt::format("{}", value), allowed);
    return failure;
  });
}

}  // namespace dspine::objectives
