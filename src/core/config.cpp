// Parsing, checking and writing of the run configuration (config.h). Every pass walks the
// declarations (core/settings.h; core's in config_settings.cpp, the sections' from their owners):
// reading from YAML, unknown-key suggestions, the rules, to_yaml and the reference's facts.
#include "core/config.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <variant>

#include <yaml-cpp/yaml.h>

#include "core/config_errors.h"
#include "core/config_settings.h"
#include "core/error.h"
#include "core/log.h"

namespace dspine::core {
namespace {

// The spellings a key allows: its enum's, or the listed choices of a string key (none = any).
std::vector<std::string> allowed_choices(const Setting& setting) {
  if (const auto* choice = std::get_if<ChoiceTarget>(&setting.target)) return choice->names;
  return setting.choices;
}

// The maps that hold core's keys; "data.synthetic" and "data.target" are nested in their sections.
const std::vector<std::string> kMaps = {"model",       "data",     "data.synthetic",
                                        "data.target", "training", "objective",
                                        "checkpoint",  "logging",  "distributed"};
const char* const kLrAlias = "training.lr";
const char* const kLearningRate = "training.learning_rate";
const char* const kObjectiveName = "objective.name";

// Keys that moved into an objective's section and are still read under the old name, with a
// warning, for one release (remove them in the release after).
const std::vector<std::pair<std::string, std::string>> kMovedKeys = {
    {"training.num_anchors", "objective.dspine.num_anchors"},
    {"training.loss_decay_gamma", "objective.dspine.loss_decay_gamma"},
    {"training.objective_chunk_blocks", "objective.dspine.objective_chunk_blocks"},
    {"model.dspine.ce_weight", "objective.dspine.ce_weight"},
    {"model.dspine.alignment_weight", "objective.dspine.alignment_weight"},
    {"model.dspine.alignment_warmup_steps", "objective.dspine.alignment_warmup_steps"},
    {"model.dspine.replacement_probability", "objective.dspine.replacement_probability"},
    {"model.dspine.replacement_hold_ratio", "objective.dspine.replacement_hold_ratio"},
    {"model.dspine.replacement_end_ratio", "objective.dspine.replacement_end_ratio"},
    {"model.dspine.candidate_mass_threshold", "objective.dspine.candidate_mass_threshold"},
};

std::string parent_of(const std::string& key) {
  size_t dot = key.rfind('.');
  return dot == std::string::npos ? "" : key.substr(0, dot);
}

std::string leaf_of(const std::string& key) {
  size_t dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

// Every settable key of `c` in to_yaml order: core's, with each section's keys (sorted by map)
// closing the core map it belongs to (model.<architecture> after model's keys, objective.<name>
// after objective.name).
Settings all_settings(Config& c) {
  Settings settings = core_settings(c);
  for (auto& [map, section] : c.sections) {
    const std::string parent = parent_of(map) + ".";
    auto last = std::find_if(settings.rbegin(), settings.rend(),
                             [&](const Setting& s) { return s.key.rfind(parent, 0) == 0; });
    Settings own = under(map, section.get().settings(c));
    settings.insert(last.base(), own.begin(), own.end());
  }
  return settings;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  std::string part;
  while (std::getline(stream, part, separator)) parts.push_back(part);
  if (!text.empty() && text.back() == separator) parts.emplace_back();
  return parts;
}

std::string trim(const std::string& text) {
  size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \t") - begin + 1);
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
    }
  }
  return row[b.size()];
}

// YAML 1.2 core-schema numbers; floats include the integers, .inf and .nan are spelt apart.
const std::regex kIntegerPattern("[-+]?[0-9]+");
const std::regex kFloatPattern("[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?");
const std::regex kInfinityPattern("[-+]?\\.(inf|Inf|INF)");
const std::regex kNanPattern("\\.(nan|NaN|NAN)");

bool is_bool_literal(const std::string& s) {
  return s == "true" || s == "True" || s == "TRUE" || s == "false" || s == "False" || s == "FALSE";
}

// yaml-cpp tags quoted scalars "!" and plain ones "?": a quoted "3" is a string, not a number.
bool is_plain_scalar(const YAML::Node& node) { return node.IsScalar() && node.Tag() != "!"; }

std::string describe_kind(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "null";
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  if (!is_plain_scalar(node)) return "a quoted string";
  const std::string& text = node.Scalar();
  if (is_bool_literal(text)) return "a boolean";
  if (std::regex_match(text, kIntegerPattern)) return "an integer";
  if (std::regex_match(text, kFloatPattern) || std::regex_match(text, kInfinityPattern) ||
      std::regex_match(text, kNanPattern)) {
    return "a float";
  }
  return "a string";
}

// The value as the user wrote it, on one line.
std::string show(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "null";
  if (node.IsScalar()) return is_plain_scalar(node) ? node.Scalar() : "\"" + node.Scalar() + "\"";
  YAML::Emitter out;
  out.SetMapFormat(YAML::Flow);
  out.SetSeqFormat(YAML::Flow);
  out << node;
  return out.c_str();
}

std::string show(const std::string& value) { return shown(value); }
std::string show(double value) { return shown(value); }
std::string show(int64_t value) { return shown(value); }

bool is_dspine_key(const std::string& key) {
  return key.rfind("model.dspine.", 0) == 0 || key.rfind("objective.dspine.", 0) == 0;
}

// `objective.<x>`: a map of an objective's settings (when x names one).
bool is_objective_section(const std::string& key) {
  return parent_of(key) == "objective" && key != kObjectiveName;
}

// The maps keys live in: core's and the configuration's sections.
std::vector<std::string> known_maps(const Config& c) {
  std::vector<std::string> maps = kMaps;
  for (const auto& [map, section] : c.sections) maps.push_back(map);
  return maps;
}

// Where errors are reported: the text's source, and which keys came from which override.
class Context {
 public:
  explicit Context(const std::string& source) : source_(source) {}

  const std::string& source() const { return source_; }

  void note_override(const std::string& key, const std::string& text) { overrides_[key] = text; }
  const std::map<std::string, std::string>& overrides() const { return overrides_; }

  [[noreturn]] void fail_value(const std::string& key, const std::string& value,
                               const std::string& problem) const {
    fail_rule(bad_value(key, value, problem));
  }
  // "<key> = <value><message>", plus the override the key came from.
  [[noreturn]] void fail_rule(const RuleFailure& failure) const {
    fail("config error in {}: {} = {}{}{}", source_, failure.key, failure.value, failure.message,
         origin(failure.key));
  }
  [[noreturn]] void fail_text(const std::string& message) const {
    fail("config error in {}: {}", source_, message);
  }

 private:
  std::string origin(const std::string& key) const {
    auto it = overrides_.find(key);
    return it == overrides_.end() ? "" : fmt::format(" (from override '{}')", it->second);
  }

  std::string source_;
  std::map<std::string, std::string> overrides_;
};

// The closest of `candidates` to `name` by edit distance; "" when none is close enough.
std::string closest_candidate(const std::string& name, const std::vector<std::string>& candidates) {
  std::string closest;
  size_t best = std::string::npos;
  for (const std::string& candidate : candidates) {
    size_t distance = edit_distance(name, candidate);
    if (distance < best) best = distance, closest = candidate;
  }
  const size_t close_enough = std::max<size_t>(2, name.size() / 3);
  return best <= close_enough ? closest : "";
}

// "<key>: unknown key in <map>; did you mean <map>.<closest sibling>?" (else the allowed names),
// plus the full keys `elsewhere` that have the same name in another section.
std::string unknown_name_message(const std::string& key, const std::vector<std::string>& siblings,
                                 const std::vector<std::string>& elsewhere) {
  const std::string map = parent_of(key);
  const std::string closest = closest_candidate(leaf_of(key), siblings);
  std::string message =
      fmt::format("{}: unknown {}", key, map.empty() ? "section" : "key in " + map);
  if (!closest.empty()) {
    message += fmt::format("; did you mean {}?", map.empty() ? closest : map + "." + closest);
  }
  if (!elsewhere.empty()) {
    message += fmt::format(" ({} belongs to another section: {})", leaf_of(key), join(elsewhere));
  } else if (closest.empty() && siblings.empty()) {
    message += fmt::format("; {} takes no keys", map);
  } else if (closest.empty()) {
    message += "; allowed: " + join(siblings);
  } else if (map.empty()) {  // the few sections are always worth listing
    message += " (allowed: " + join(siblings) + ")";
  }
  return message;
}

// unknown_name_message over a key table: siblings are the keys and maps (`maps` hold keys) of the
// same map.
std::string unknown_key_message(const std::string& full_key, const Settings& keys,
                                const std::vector<std::string>& maps) {
  // A name on the path exists when it is a listed map, holds a key or is a key. The first that
  // does not is what is unknown: an override of trainng.lr is about the section trainng.
  auto exists = [&](const std::string& m) {
    auto holds = [&](const Setting& k) { return parent_of(k.key) == m || k.key == m; };
    return std::find(maps.begin(), maps.end(), m) != maps.end() ||
           std::any_of(keys.begin(), keys.end(), holds);
  };
  std::string key = full_key;
  while (!parent_of(key).empty() && !exists(parent_of(key))) key = parent_of(key);
  const std::string map = parent_of(key);
  const std::string name = leaf_of(key);
  std::vector<std::string> siblings;  // names allowed in `map`
  for (const Setting& k : keys) {
    if (parent_of(k.key) == map) siblings.push_back(leaf_of(k.key));
  }
  for (const std::string& m : maps) {
    if (parent_of(m) == map) siblings.push_back(leaf_of(m));
  }
  if (map == "training") siblings.push_back("lr");

  std::vector<std::string> elsewhere;
  for (const Setting& k : keys) {
    if (leaf_of(k.key) == name && parent_of(k.key) != map) elsewhere.push_back(k.key);
  }
  for (const std::string& m : maps) {
    if (leaf_of(m) == name && parent_of(m) != map) elsewhere.push_back(m);
  }
  return unknown_name_message(key, siblings, elsewhere);
}

// Reads a YAML tree into a Config, checking each value's type (the rules run after, once every
// key is read: check_rules).
class Reader {
 public:
  // `maps`: the maps that hold `keys`; `sections`: those of them that are sections.
  Reader(const Context& context, Settings keys, std::vector<std::string> maps,
         std::vector<std::string> sections)
      : context_(context),
        keys_(std::move(keys)),
        maps_(std::move(maps)),
        sections_(std::move(sections)) {}

  void read_root(const YAML::Node& root) {
    if (!root.IsDefined() || root.IsNull()) return;  // empty text: all defaults
    if (!root.IsMap()) {
      context_.fail_text(fmt::format("the top level must be a map of sections ({}), got {}",
                                     join(top_level_maps()), describe_kind(root)));
    }
    read_map(root, "");
  }

  // One map of keys at `path`; null keeps the defaults.
  void read_section(const YAML::Node& node, const std::string& path) {
    if (node.IsNull()) return;
    if (!node.IsMap()) {
      context_.fail_value(path, show(node),
                          fmt::format("expected a map of keys, got {}", describe_kind(node)));
    }
    read_map(node, path);
  }

  const Setting* find(const std::string& name) const {
    for (const Setting& key : keys_) {
      if (key.key == name) return &key;
    }
    return nullptr;
  }

  const Settings& keys() const { return keys_; }
  const std::vector<std::string>& maps() const { return maps_; }

 private:
  std::vector<std::string> top_level_maps() const {
    std::vector<std::string> maps;
    for (const std::string& m : maps_) {
      if (parent_of(m).empty()) maps.push_back(m);
    }
    return maps;
  }

  void read_map(const YAML::Node& map, const std::string& path) {
    for (auto it = map.begin(); it != map.end(); ++it) {
      if (!it->first.IsScalar()) {
        context_.fail_text(fmt::format("{}: keys must be names, got {}",
                                       path.empty() ? "top level" : path, show(it->first)));
      }
      const std::string name = it->first.Scalar();
      const std::string key = path.empty() ? name : path + "." + name;
      const std::string canonical = key == kLrAlias ? kLearningRate : key;
      auto [previous, first] = seen_.emplace(canonical, key);
      if (!first) {
        if (previous->second != key) {
          context_.fail_text(
              "training.lr and training.learning_rate are both given (lr is an alias of "
              "learning_rate); give one");
        }
        context_.fail_text(fmt::format("{} is given twice", key));
      }
      // A copy: it-> returns a proxy, whose Node would die with the full expression.
      const YAML::Node value = it->second;
      const bool section = std::find(sections_.begin(), sections_.end(), key) != sections_.end();
      if (const Setting* target = find(canonical)) {
        read_value(*target, value);
      } else if ((section || is_objective_section(key)) && !value.IsNull() && !value.IsMap()) {
        fail_section_value(key, value);
      } else if (std::find(maps_.begin(), maps_.end(), key) != maps_.end()) {
        read_section(value, key);  // "section:" with nothing under it keeps the defaults
      } else {
        context_.fail_text(unknown_key_message(key, keys_, maps_));
      }
    }
  }

  // A section (objective.<x>, model.<architecture>) given as something other than a map.
  [[noreturn]] void fail_section_value(const std::string& key, const YAML::Node& value) const {
    const bool objective = is_objective_section(key);
    std::string problem =
        fmt::format("{} settings must be a map, got {}",
                    objective ? "an objective's" : "an architecture's", describe_kind(value));
    if (objective && !closest_candidate(leaf_of(key), {leaf_of(kObjectiveName)}).empty()) {
      problem += fmt::format("; did you mean {}?", kObjectiveName);
    }
    context_.fail_value(key, show(value), problem);
  }

  void read_value(const Setting& key, const YAML::Node& node) const {
    std::visit(
        [&](auto& target) {
          if constexpr (std::is_same_v<std::decay_t<decltype(target)>, ChoiceTarget>) {
            read_choice(key, node, target);
          } else {
            read_into(key, node, *target);
          }
        },
        key.target);
  }

  [[noreturn]] void fail_type(const Setting& key, const YAML::Node& node,
                              const std::string& expected) const {
    context_.fail_value(key.key, show(node),
                        fmt::format("{}, got {}", expected, describe_kind(node)));
  }

  int64_t parse_int(const Setting& key, const std::string& name, const YAML::Node& node) const {
    // The reference's first DSpine rule: integers and not bools, so 2.5 and 1024.0 fail.
    const std::string expected = is_dspine_key(key.key)
                                     ? fmt::format("DSpine {} must be an integer", leaf_of(key.key))
                                     : "expected an integer";
    if (!is_plain_scalar(node) || !std::regex_match(node.Scalar(), kIntegerPattern)) {
      context_.fail_value(name, show(node),
                          fmt::format("{}, got {}", expected, describe_kind(node)));
    }
    const std::string& text = node.Scalar();
    const char* begin = text.data() + (text[0] == '+' ? 1 : 0);
    int64_t value = 0;
    auto [end, error] = std::from_chars(begin, text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size()) {
      context_.fail_value(name, show(node), "integer outside the 64-bit range");
    }
    return value;
  }

  void read_into(const Setting& key, const YAML::Node& node, int64_t& out) const {
    out = parse_int(key, key.key, node);
  }

  void read_into(const Setting& key, const YAML::Node& node, double& out) const {
    // .inf and .nan are read so that they are reported as non-finite, not as non-numbers.
    const std::string text = is_plain_scalar(node) ? node.Scalar() : "";
    if (std::regex_match(text, kFloatPattern)) {
      out = std::strtod(text.c_str(), nullptr);
    } else if (std::regex_match(text, kInfinityPattern) || std::regex_match(text, kNanPattern)) {
      out = std::nan("");
    } else {
      fail_type(key, node, "expected a number");
    }
    if (!std::isfinite(out)) {
      context_.fail_value(key.key, show(node),
                          is_dspine_key(key.key)
                              ? fmt::format("DSpine {} must be finite", leaf_of(key.key))
                              : std::string("must be a finite number"));
    }
  }

  void read_into(const Setting& key, const YAML::Node& node, std::string& out) const {
    if (!node.IsScalar()) fail_type(key, node, "expected a string");
    std::string value = node.Scalar();
    if (key.accepts_bool && is_plain_scalar(node) && is_bool_literal(value)) {
      std::transform(value.begin(), value.end(), value.begin(), ::tolower);
    }
    const std::vector<std::string> choices = allowed_choices(key);
    if (!choices.empty() && std::find(choices.begin(), choices.end(), value) == choices.end()) {
      context_.fail_value(key.key, show(node), "not an allowed value; allowed: " + join(choices));
    }
    out = value;
  }

  // A closed choice: read as a string checked against the enum's spellings, then mapped.
  void read_choice(const Setting& key, const YAML::Node& node, const ChoiceTarget& out) const {
    std::string name;
    read_into(key, node, name);
    for (size_t i = 0; i < out.names.size(); ++i) {
      if (name == out.names[i]) out.set(i);
    }
  }

  void read_into(const Setting& key, const YAML::Node& node, bool& out) const {
    if (!is_plain_scalar(node) || !is_bool_literal(node.Scalar())) {
      fail_type(key, node, "expected a boolean (true or false)");
    }
    out = node.Scalar()[0] == 't' || node.Scalar()[0] == 'T';
  }

  void read_into(const Setting& key, const YAML::Node& node, std::vector<int64_t>& out) const {
    if (!node.IsSequence()) fail_type(key, node, "expected a list of integers");
    std::vector<int64_t> values;
    for (size_t i = 0; i < node.size(); ++i) {
      values.push_back(parse_int(key, fmt::format("{}[{}]", key.key, i), node[i]));
    }
    out = values;
  }

  const Context& context_;
  Settings keys_;
  std::vector<std::string> maps_;
  std::vector<std::string> sections_;
  std::map<std::string, std::string> seen_;  // canonical key -> spelling used
};

// Sets key `parts` in the tree to `value`, creating the maps on the way. A map position already
// holding a non-map is left alone: reading the tree reports it.
void set_path(YAML::Node map, const std::vector<std::string>& parts, size_t i,
              const YAML::Node& value) {
  if (i + 1 == parts.size()) {
    map[parts[i]] = value;
    return;
  }
  YAML::Node child = map[parts[i]];
  if (!child.IsDefined() || child.IsNull()) map[parts[i]] = YAML::Node(YAML::NodeType::Map);
  if (!map[parts[i]].IsMap()) return;
  set_path(map[parts[i]], parts, i + 1, value);
}

// The node at `parts` of the tree, undefined when absent. Walks const nodes: a non-const
// operator[] would add the missing keys.
YAML::Node node_at(const YAML::Node& node, const std::vector<std::string>& parts, size_t i = 0) {
  if (i == parts.size()) return node;
  if (!node.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  const YAML::Node child = node[parts[i]];
  // A missing key gives an invalid node, whose type queries throw: hand back an undefined one.
  if (!child.IsDefined()) return YAML::Node(YAML::NodeType::Undefined);
  return node_at(child, parts, i + 1);
}

void remove_key(const YAML::Node& root, const std::string& key) {
  YAML::Node parent = node_at(root, split(parent_of(key), '.'));
  if (parent.IsMap()) parent.remove(leaf_of(key));
}

// The new name of a key listed in kMovedKeys, else "".
std::string moved_to(const std::string& key) {
  for (const auto& [old_key, new_key] : kMovedKeys) {
    if (key == old_key) return new_key;
  }
  return "";
}

// The old name of a key listed in kMovedKeys, else "".
std::string moved_from(const std::string& key) {
  for (const auto& [old_key, new_key] : kMovedKeys) {
    if (key == new_key) return old_key;
  }
  return "";
}

void warn_moved(const Context& context, const std::string& old_key, const std::string& new_key) {
  log::warn("{}: {} is deprecated; use {}", context.source(), old_key, new_key);
}

// Moves every deprecated key of the tree to its new place (kMovedKeys); both given is an error.
void move_legacy_keys(YAML::Node& root, const Context& context) {
  for (const auto& [old_key, new_key] : kMovedKeys) {
    const YAML::Node value = node_at(root, split(old_key, '.'));
    if (!value.IsDefined()) continue;
    if (node_at(root, split(new_key, '.')).IsDefined()) {
      context.fail_text(fmt::format("{} and {} are both given ({} is the deprecated name of {}); "
                                    "give {}",
                                    old_key, new_key, old_key, new_key, new_key));
    }
    warn_moved(context, old_key, new_key);
    set_path(root, split(new_key, '.'), 0, YAML::Clone(value));
    remove_key(root, old_key);
  }
}

void apply_override(YAML::Node& root, const std::string& text, Context& context,
                    const Reader& reader) {
  const size_t equals = text.find('=');
  std::string key = trim(text.substr(0, equals));
  std::vector<std::string> parts = split(key, '.');
  if (equals == std::string::npos || key.empty() ||
      std::any_of(parts.begin(), parts.end(), [](const std::string& p) { return p.empty(); })) {
    context.fail_text(
        fmt::format("override '{}' is malformed; expected section.key=value, e.g. "
                    "training.learning_rate=3e-4",
                    text));
  }
  const std::vector<std::string>& maps = reader.maps();
  if (std::find(maps.begin(), maps.end(), key) != maps.end()) {
    context.fail_text(fmt::format("override '{}' names the map {}, not a key; set its keys one "
                                  "at a time",
                                  text, key));
  }
  if (const std::string new_key = moved_to(key); !new_key.empty()) {
    warn_moved(context, key, new_key);
    key = new_key;
    parts = split(key, '.');
  }
  if (key != kLrAlias && reader.find(key) == nullptr) {
    context.fail_text(
        fmt::format("override '{}': {}", text, unknown_key_message(key, reader.keys(), maps)));
  }
  const std::string value_text = trim(text.substr(equals + 1));
  YAML::Node value;
  try {
    // An empty value is the empty string (e.g. logging.metrics_file= disables the file).
    value = value_text.empty() ? YAML::Node(std::string()) : YAML::Load(value_text);
  } catch (const YAML::ParserException& e) {
    context.fail_text(fmt::format("override '{}': the value is not valid YAML: {}", text, e.msg));
  }
  if (!root.IsMap()) {
    if (root.IsDefined() && !root.IsNull()) return;  // reading the tree reports the bad top level
    root.reset(YAML::Node(YAML::NodeType::Map));
  }
  // An override of the learning rate replaces the file's value under either spelling.
  if (key == kLrAlias || key == kLearningRate) {
    YAML::Node training = root["training"];
    if (training.IsMap()) {
      training.remove("lr");
      training.remove("learning_rate");
    }
  }
  // Likewise for a moved key: the override replaces the file's value under its old name.
  if (const std::string old_key = moved_from(key); !old_key.empty()) remove_key(root, old_key);
  set_path(root, parts, 0, value);
  context.note_override(key == kLrAlias ? kLearningRate : key, text);
}

// Every rule, once, in declaration order: core's keys, then the sections' (whose rules may read
// core's values). The first failure is the error.
void check_rules(const Context& context, const Settings& settings) {
  for (const Setting& setting : settings) {
    if (!setting.rule.check) continue;
    if (const auto failure = setting.rule.check(setting.key)) context.fail_rule(*failure);
  }
}

}  // namespace

Config parse_config(const std::string& yaml_text, const std::string& source,
                    const std::vector<std::string>& overrides, const SectionCatalog& catalog) {
  Context context(source);
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::ParserException& e) {
    context.fail_text(fmt::format("YAML syntax error at line {}, column {}: {}", e.mark.line + 1,
                                  e.mark.column + 1, e.msg));
  }
  Config config;
  config.source = source;
  std::vector<std::string> sections;
  for (const SectionType& type : catalog) {
    config.sections.emplace(type.map, SectionValue(type.make()));
    sections.push_back(type.map);
  }
  const Settings settings = all_settings(config);
  Reader reader(context, settings, known_maps(config), sections);
  for (const std::string& text : overrides) apply_override(root, text, context, reader);
  move_legacy_keys(root, context);
  reader.read_root(root);
  check_rules(context, settings);
  config.overrides = context.overrides();
  return config;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   const SectionCatalog& catalog) {
  if (path.empty()) {
    return parse_config(kEmbeddedDefaultConfig, "<embedded default>", overrides, catalog);
  }
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    fail("config error: cannot read config file '{}': it is a directory", path);
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("config error: cannot read config file '{}': {}", path, std::strerror(errno));
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) fail("config error: cannot read config file '{}': read failed", path);
  return parse_config(text.str(), path, overrides, catalog);
}

int64_t training_rows(const Config& config, int64_t world_size) {
  const TrainingConfig& t = config.training;
  return t.total_steps * t.accumulation_steps * t.batch_size * world_size;
}

int64_t eval_offset(const Config& config, int64_t world_size) {
  const DataConfig& data = config.data;
  if (data.eval_offset >= 0) return data.eval_offset;
  const bool separate = !data.eval_samples_file.empty() || !data.eval_shards_dir.empty() ||
                        !data.eval_specforge_dir.empty();
  return separate ? 0 : training_rows(config, world_size);
}

namespace {

// The value as to_yaml writes it: plain numbers and booleans, quoted strings and choices.
void write_value(YAML::Emitter& out, const SettingTarget& target) {
  std::visit(
      [&](const auto& value) {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, ChoiceTarget>) {
          out << YAML::DoubleQuoted << value.names.at(value.get());
        } else if constexpr (std::is_same_v<T, std::string*>) {
          out << YAML::DoubleQuoted << *value;
        } else if constexpr (std::is_same_v<T, bool*>) {
          out << YAML::TrueFalseBool << *value;
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>*>) {
          out << YAML::Flow << YAML::BeginSeq;
          for (int64_t v : *value) out << show(v);
          out << YAML::EndSeq;
        } else {
          out << show(*value);  // doubles: shortest text that reads back to the same value
        }
      },
      target);
}

std::string type_name(const SettingTarget& target) {
  return std::visit(
      [](const auto& value) -> std::string {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, int64_t*>) {
          return "integer";
        } else if constexpr (std::is_same_v<T, double*>) {
          return "number";
        } else if constexpr (std::is_same_v<T, bool*>) {
          return "boolean";
        } else if constexpr (std::is_same_v<T, std::string*> || std::is_same_v<T, ChoiceTarget>) {
          return "string";
        } else {
          return "list of integers";
        }
      },
      target);
}

// The value as the reference and the resume comparison show it.
std::string value_text(const SettingTarget& target) {
  return std::visit(
      [](const auto& value) -> std::string {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, ChoiceTarget>) {
          return show(value.names.at(value.get()));
        } else if constexpr (std::is_same_v<T, bool*>) {
          return *value ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>*>) {
          std::vector<std::string> items;
          for (int64_t v : *value) items.push_back(show(v));
          return "[" + join(items) + "]";
        } else {
          return show(*value);
        }
      },
      target);
}

std::vector<KeyFacts> facts_of(const Settings& settings) {
  std::vector<KeyFacts> facts;
  for (const Setting& setting : settings) {
    const std::vector<std::string> choices = allowed_choices(setting);
    facts.push_back({setting.key, type_name(setting.target), value_text(setting.target),
                     choices.empty() ? setting.rule.allowed : join(choices), setting.description});
  }
  return facts;
}

}  // namespace

std::string to_yaml(const Config& config) {
  Config copy = config;  // the declarations hand out mutable pointers; to_yaml only reads them
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::vector<std::string> open;  // the maps currently open, e.g. {"model", "dspine"}
  for (const Setting& key : all_settings(copy)) {
    std::vector<std::string> path = split(key.key, '.');
    const std::string leaf = path.back();
    path.pop_back();
    size_t common = 0;
    while (common < open.size() && common < path.size() && open[common] == path[common]) ++common;
    while (open.size() > common) {
      out << YAML::EndMap;
      open.pop_back();
    }
    while (open.size() < path.size()) {
      const std::string& name = path[open.size()];
      out << YAML::Key << name << YAML::Value << YAML::BeginMap;
      open.push_back(name);
    }
    out << YAML::Key << leaf << YAML::Value;
    write_value(out, key.target);
  }
  while (!open.empty()) {
    out << YAML::EndMap;
    open.pop_back();
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::map<std::string, std::string> setting_values(const Config& config) {
  Config copy = config;
  std::map<std::string, std::string> values;
  for (const Setting& setting : all_settings(copy)) {
    values[setting.key] = value_text(setting.target);
  }
  return values;
}

std::vector<KeyFacts> core_key_facts() {
  Config defaults;
  return facts_of(core_settings(defaults));
}

std::vector<KeyFacts> section_key_facts(const SectionCatalog& catalog) {
  // A default configuration: the rules that read core's values document themselves alone.
  const Config defaults;
  std::vector<KeyFacts> facts;
  for (const SectionType& type : catalog) {
    const auto section = type.make();
    for (KeyFacts& key : facts_of(under(type.map, section->settings(defaults)))) {
      facts.push_back(std::move(key));
    }
  }
  return facts;
}

void section_type_error(const std::string& map) {
  fail("config: the map {} holds settings of another type than the code asks for", map);
}

const std::vector<std::string>& architecture_names() { return architecture_choices(); }

void range_error(const Config& config, const std::string& key, const std::string& value,
                 const std::string& allowed) {
  Context context(config.source.empty() ? "<config>" : config.source);
  for (const auto& [overridden, text] : config.overrides) context.note_override(overridden, text);
  context.fail_rule(out_of_range(key, value, allowed));
}

std::string closest_name(const std::string& name, const std::vector<std::string>& candidates) {
  return closest_candidate(name, candidates);
}

}  // namespace dspine::core
