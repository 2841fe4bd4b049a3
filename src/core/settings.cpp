#include "core/settings.h"

#include <fmt/format.h>

namespace dspine::core {
std::string shown(int64_t value) { return fmt::format("{}", value); }

// The shortest text that reads back to the same double; an exponent gets a mantissa with a dot
// ("1.0e-06") so that YAML 1.1 readers such as PyYAML also see a float.
std::string shown(double value) {
  std::string text = fmt::format("{}", value);
  const size_t exponent = text.find('e');
  if (exponent != std::string::npos && text.find('.') == std::string::npos) {
    text.insert(exponent, ".0");
  }
  return text;
}

std::string shown(const std::string& value) { return "\"" + value + "\""; }

RuleFailure out_of_range(const std::string& key, std::string value, const std::string& allowed) {
  return {key, std::move(value), " is out of range; allowed: " + allowed};
}

RuleFailure bad_value(const std::string& key, std::string value, const std::string& problem) {
  return {key, std::move(value), ": " + problem};
}

RuleFailure broken_rule(const std::string& key, std::string value, const std::string& problem) {
  return {key, std::move(value), " is out of range: " + problem};
}

Rule rule(std::string allowed,
          std::function<std::optional<RuleFailure>(const std::string&)> check) {
  return {std::move(allowed), std::move(check)};
}

Rule documented(std::string allowed) { return {std::move(allowed), nullptr}; }

Rule at_least(const int64_t& value, int64_t low) {
  return require(
      value, [low](int64_t v) { return v >= low; }, fmt::format("integer >= {}", low));
}

Rule positive(const double& value) {
  return require(
      value, [](double v) { return v > 0; }, "number > 0");
}

Rule nonnegative(const double& value) {
  return require(
      value, [](double v) { return v >= 0; }, "number >= 0");
}

Rule fraction(const double& value) {
  return require(
      value, [](double v) { return v >= 0 && v < 1; }, "number in [0, 1)");
}

Rule not_empty(const std::string& value) {
  return rule("not empty", [&value](const std::string& key) {
    std::optional<RuleFailure> failure;
    if (value.empty()) failure = bad_value(key, shown(value), "must not be empty");
    return failure;
  });
}

Settings under(const std::string& map, Settings settings) {
  for (Setting& setting : settings) setting.key = map + "." + setting.key;
  return settings;
}

}  // namespace dspine::core
