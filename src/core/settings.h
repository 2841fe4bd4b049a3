// One declaration per setting (docs/ARCHITECTURE.md, "What a new key costs"): a settings struct
// keeps its members and their defaults, and one function lists, per member, its key, its rule and
// its description. That list drives everything the configuration does with the member: reading it
// from YAML, checking it, writing it back (to_yaml, --print-config), the reference page and the
// resume comparison (core/config.cpp).
//
// Core's sections declare theirs in core/config_settings.cpp. A map core does not know (an
// objective's objective.<name>, an architecture's model.<name>) is a Section: its owner declares a
// `settings_of(S&, const Config&)` next to the struct and lists the map in the catalog it hands to
// parse_config (train/run_config.h), and core reads, checks and writes it like its own.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace dspine::core {

struct Config;

// A closed choice: an enumerator and its YAML spelling. Each enum of the configuration has a
// constexpr `choices_of(E)` table listing every enumerator in the order the allowed values are
// shown; reading maps a spelling to its enumerator (naming key, value and the allowed spellings on
// a bad one), to_string gives the spelling back.
template <typename E>
struct Choice {
  E value;
  const char* name;  // the YAML spelling
};

// The YAML spelling of a choice, e.g. to_string(Sharding::kZero3) == "zero3".
template <typename E, typename = decltype(choices_of(E{}))>
std::string to_string(E value) {
  for (const Choice<E>& choice : choices_of(value)) {
    if (choice.value == value) return choice.name;
  }
  return std::to_string(static_cast<std::underlying_type_t<E>>(value));  // not in the table
}

// An enum member seen through its spellings, so that core reads and writes enums it does not know.
struct ChoiceTarget {
  std::vector<std::string> names;         // every spelling, in table order
  std::function<size_t()> get;            // the member's index in `names`
  std::function<void(size_t index)> set;  // sets the member to names[index]'s enumerator
};

template <typename E>
ChoiceTarget choice_target(E* member) {
  ChoiceTarget target;
  for (const Choice<E>& choice : choices_of(E{})) target.names.push_back(choice.name);
  target.get = [member] {
    const auto table = choices_of(E{});
    for (size_t i = 0; i < table.size(); ++i) {
      if (table[i].value == *member) return i;
    }
    return table.size();
  };
  target.set = [member](size_t index) { *member = choices_of(E{})[index].value; };
  return target;
}

using SettingTarget =
    std::variant<int64_t*, double*, std::string*, bool*, std::vector<int64_t>*, ChoiceTarget>;

// A value a rule refused: the error reads "config error in <source>: <key> = <value><message>",
// plus the --set override the key came from.
struct RuleFailure {
  std::string key;    // the setting's key, or one item of it ("model.target_layer_ids[1]")
  std::string value;  // as the error shows it
  // ": <problem>", " is out of range; allowed: <...>" or " is out of range: <problem>"
  std::string message;
};

// What a setting allows: the text the reference lists, and the check of a read value.
struct Rule {
  std::string allowed;  // "" = any value of the type
  // Empty when the value is allowed. Called once per run, after every key has been read, with the
  // setting's full key; a rule may read other settings of the run (captured by reference).
  std::function<std::optional<RuleFailure>(const std::string& key)> check;
};

// Values as errors and to_yaml show them: shortest round-trip numbers, quoted strings.
std::string shown(int64_t value);
std::string shown(double value);
std::string shown(const std::string& value);

// Rule constructors over a member (read when the rule is checked). Their `allowed` texts are
// the ones docs/config.md lists.
Rule at_least(const int64_t& value, int64_t low);  // "integer >= low"
Rule positive(const double& value);                // "number > 0"
Rule nonnegative(const double& value);             // "number >= 0"
Rule fraction(const double& value);                // "number in [0, 1)"
Rule not_empty(const std::string& value);          // "not empty"
// Any rule: `allowed` for the reference, `check` for the value.
Rule rule(std::string allowed, std::function<std::optional<RuleFailure>(const std::string&)> check);
// A documented rule checked elsewhere (a choice's spellings, a rule of the whole run).
Rule documented(std::string allowed);

// The three error forms, for rules written with rule().
RuleFailure out_of_range(const std::string& key, std::string value, const std::string& allowed);
RuleFailure bad_value(const std::string& key, std::string value, const std::string& problem);
RuleFailure broken_rule(const std::string& key, std::string value, const std::string& problem);

// `ok(value)` must hold (value an int64_t, double or string member); otherwise
// "<key> = <value> is out of range; allowed: <allowed>". The constructors above are its common
// cases.
template <typename T, typename Ok>
Rule require(const T& value, Ok ok, std::string allowed) {
  return rule(allowed, [&value, ok, allowed](const std::string& key) {
    std::optional<RuleFailure> failure;
    if (!ok(value)) failure = out_of_range(key, shown(value), allowed);
    return failure;
  });
}

// One setting: key, member, rule, description (the default is the member's initial value).
struct Setting {
  std::string key;  // relative to the declaring map ("seed", "synthetic.seed"); full once listed
  SettingTarget target;
  Rule rule = {};
  std::string description = "";
  std::vector<std::string> choices = {};  // a string key's allowed values; empty = any string
  bool accepts_bool = false;              // auto|true|false keys: YAML true/false read as text
};
using Settings = std::vector<Setting>;

// `settings` with every key prefixed "map.".
Settings under(const std::string& map, Settings settings);

// A map of settings core does not know the type of (an objective's or an architecture's), held by
// value in Config::sections.
class Section {
 public:
  virtual ~Section() = default;
  // The declaration, with targets in this section; `run` is the configuration being read (its
  // core sections are read before any rule runs).
  virtual Settings settings(const Config& run) = 0;
  virtual std::unique_ptr<Section> clone() const = 0;
};

template <typename S>
class TypedSection final : public Section {
 public:
  explicit TypedSection(S value = S{}) : value(std::move(value)) {}
  Settings settings(const Config& run) override { return settings_of(value, run); }  // by ADL
  std::unique_ptr<Section> clone() const override { return std::make_unique<TypedSection>(*this); }
  S value;
};

// A section of a Config, with value semantics (copying the Config copies it).
class SectionValue {
 public:
  explicit SectionValue(std::unique_ptr<Section> section) : section_(std::move(section)) {}
  SectionValue(const SectionValue& other) : section_(other.section_->clone()) {}
  SectionValue& operator=(const SectionValue& other) {
    section_ = other.section_->clone();
    return *this;
  }
  SectionValue(SectionValue&&) = default;
  SectionValue& operator=(SectionValue&&) = default;
  Section& get() const { return *section_; }

 private:
  std::unique_ptr<Section> section_;
};

// A map with no settings (objective.ce, model.simple): any key under it is unknown.
struct NoSettings {};
inline Settings settings_of(NoSettings&, const Config&) { return {}; }

// The maps a configuration may hold beyond core's, each with its default settings: parse_config
// reads them, and a key under a map not listed is unknown.
struct SectionType {
  std::string map;  // full key: "objective.gspo", "model.dspine"
  std::function<std::unique_ptr<Section>()> make;
};
using SectionCatalog = std::vector<SectionType>;

template <typename S>
SectionType section_type(std::string map) {
  return {std::move(map), [] { return std::make_unique<TypedSection<S>>(); }};
}

}  // namespace dspine::core
