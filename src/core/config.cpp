// Parsing and validation of the run configuration (config.h) and of the objective sections
// (config_section.h). The key table in keys_of() is the one list of settable keys: reading,
// unknown-key suggestions and to_yaml all walk it, so a new struct field needs one line there
// (plus its range check in validate()). Objective sections are kept raw and read later by their
// objective with the same Reader.
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

#include "core/config_section.h"
#include "core/error.h"
#include "core/log.h"

namespace dspine::core {
namespace {

// Where a key's value goes: the objectives' setting types (config_section.h) or a closed choice.
using Target = std::variant<int64_t*, double*, std::string*, bool*, std::vector<int64_t>*, Device*,
                            Dtype*, Sharding*, CommBackend*, DataSource*, FusedKernels*,
                            LrScheduler*, OnNonfinite*, ProgressMode*, LogLevel*>;

Target target_of(const SettingTarget& setting) {
  return std::visit([](auto* value) -> Target { return value; }, setting);
}

struct Key {
  std::string name;  // full dotted key, e.g. "model.dspine.top_k"
  Target target;
  std::vector<std::string> choices = {};  // allowed values of a string key; empty = any string
  bool accepts_bool = false;  // auto|true|false keys: YAML true/false are read as "true"/"false"
};

template <typename E>
std::vector<std::string> names_of() {
  std::vector<std::string> names;
  for (const Choice<E>& choice : choices_of(E{})) names.push_back(choice.name);
  return names;
}

// The spellings a key allows: its enum's, or the listed choices of a string key (none = any).
std::vector<std::string> allowed_choices(const Key& key) {
  return std::visit(
      [&](auto* value) -> std::vector<std::string> {
        using T = std::decay_t<decltype(*value)>;
        if constexpr (std::is_enum_v<T>) {
          return names_of<T>();
        } else {
          return key.choices;
        }
      },
      key.target);
}

// The maps that hold keys; "data.synthetic" and "data.target" are nested in their sections.
const std::vector<std::string> kMaps = {"model",       "data",     "data.synthetic",
                                        "data.target", "training", "objective",
                                        "checkpoint",  "logging",  "distributed"};
// model.architecture's choices; each names a kept map model.<name> (model/draft_registry.h).
const std::vector<std::string> kArchitectures = {"simple", "dspine"};
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

// Every settable key, in struct order (which is also the order to_yaml writes them).
std::vector<Key> keys_of(Config& c) {
  ModelConfig& m = c.model;
  DataConfig& data = c.data;
  SyntheticTargetConfig& s = c.data.synthetic;
  TrainingConfig& t = c.training;
  return {
      {"model.architecture", &m.architecture, kArchitectures},
      {"model.hidden_size", &m.hidden_size},
      {"model.intermediate_size", &m.intermediate_size},
      {"model.num_hidden_layers", &m.num_hidden_layers},
      {"model.num_attention_heads", &m.num_attention_heads},
      {"model.num_key_value_heads", &m.num_key_value_heads},
      {"model.head_dim", &m.head_dim},
      {"model.vocab_size", &m.vocab_size},
      {"model.rms_norm_eps", &m.rms_norm_eps},
      {"model.rope_theta", &m.rope_theta},
      {"model.initializer_range", &m.initializer_range},
      {"model.block_size", &m.block_size},
      {"model.mask_token_id", &m.mask_token_id},
      {"model.target_layer_ids", &m.target_layer_ids},
      {"model.num_target_layers", &m.num_target_layers},
      {"model.fused_kernels", &m.fused_kernels, {}, true},
      {"data.source", &data.source},
      {"data.shards_dir", &data.shards_dir},
      {"data.samples", &data.samples},
      {"data.specforge_dir", &data.specforge_dir},
      {"data.seq_len", &data.seq_len},
      {"data.eval_samples", &data.eval_samples},
      {"data.eval_offset", &data.eval_offset},
      {"data.eval_samples_file", &data.eval_samples_file},
      {"data.eval_shards_dir", &data.eval_shards_dir},
      {"data.eval_specforge_dir", &data.eval_specforge_dir},
      {"data.synthetic.seed", &s.seed},
      {"data.synthetic.num_layers", &s.num_layers},
      {"data.synthetic.num_attention_heads", &s.num_attention_heads},
      {"data.synthetic.num_key_value_heads", &s.num_key_value_heads},
      {"data.synthetic.head_dim", &s.head_dim},
      {"data.synthetic.intermediate_size", &s.intermediate_size},
      {"data.synthetic.logit_scale", &s.logit_scale},
      {"data.synthetic.temperature", &s.temperature},
      {"data.synthetic.prompt_length", &s.prompt_length},
      {"data.target.path", &data.target.path},
      {"data.target.random", &data.target.random},
      {"data.target.seed", &data.target.seed},
      {"data.target.prefetch", &data.target.prefetch},
      {"training.batch_size", &t.batch_size},
      {"training.accumulation_steps", &t.accumulation_steps},
      {"training.total_steps", &t.total_steps},
      {"training.learning_rate", &t.learning_rate},
      {"training.lr_scheduler", &t.lr_scheduler},
      {"training.warmup_ratio", &t.warmup_ratio},
      {"training.max_grad_norm", &t.max_grad_norm},
      {"training.weight_decay", &t.weight_decay},
      {"training.adam_beta1", &t.adam_beta1},
      {"training.adam_beta2", &t.adam_beta2},
      {"training.adam_eps", &t.adam_eps},
      {"training.seed", &t.seed},
      {"training.dtype", &t.dtype},
      {"training.device", &t.device},
      {"training.cpu_threads", &t.cpu_threads},
      {"training.deterministic", &t.deterministic},
      {"training.on_nonfinite", &t.on_nonfinite},
      {"training.eval_every", &t.eval_every},
      {"training.eval_decode_tokens", &t.eval_decode_tokens},
      {"training.eval_decode_prompt_tokens", &t.eval_decode_prompt_tokens},
      {"training.eval_decode_temperature", &t.eval_decode_temperature},
      {"training.init_from", &t.init_from},
      {"objective.name", &c.objective.name},
      {"checkpoint.dir", &c.checkpoint.dir},
      {"checkpoint.save_every", &c.checkpoint.save_every},
      {"checkpoint.keep_last", &c.checkpoint.keep_last},
      {"checkpoint.resume", &c.checkpoint.resume},
      {"logging.every", &c.logging.every},
      {"logging.metrics_file", &c.logging.metrics_file},
      {"logging.progress", &c.logging.progress, {}, true},
      {"logging.level", &c.logging.level},
      {"distributed.backend", &c.distributed.backend},
      {"distributed.sharding", &c.distributed.sharding},
      {"distributed.timeout_s", &c.distributed.timeout_s},
      {"distributed.prefetch", &c.distributed.prefetch},
  };
}

std::string parent_of(const std::string& key) {
  size_t dot = key.rfind('.');
  return dot == std::string::npos ? "" : key.substr(0, dot);
}

std::string leaf_of(const std::string& key) {
  size_t dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
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

std::string show(const std::string& value) { return "\"" + value + "\""; }
// The shortest text that reads back to the same double; an exponent gets a mantissa with a dot
// ("1.0e-06") so that YAML 1.1 readers such as PyYAML also see a float.
std::string show(double value) {
  std::string text = fmt::format("{}", value);
  const size_t exponent = text.find('e');
  if (exponent != std::string::npos && text.find('.') == std::string::npos) {
    text.insert(exponent, ".0");
  }
  return text;
}
std::string show(int64_t value) { return fmt::format("{}", value); }

bool is_dspine_key(const std::string& key) {
  return key.rfind("model.dspine.", 0) == 0 || key.rfind("objective.dspine.", 0) == 0;
}

// `objective.<section>`: one objective's settings, kept raw for that objective to read.
bool is_objective_section(const std::string& key) {
  return parent_of(key) == "objective" && key != kObjectiveName;
}

// `model.<architecture>`: one draft architecture's settings, kept raw for its registry entry.
bool is_architecture_section(const std::string& key) {
  return parent_of(key) == "model" && std::find(kArchitectures.begin(), kArchitectures.end(),
                                                leaf_of(key)) != kArchitectures.end();
}

bool is_kept_section(const std::string& key) {
  return is_objective_section(key) || is_architecture_section(key);
}

// The maps unknown-key messages suggest from: core's and the architectures' kept maps.
std::vector<std::string> known_maps() {
  std::vector<std::string> maps = kMaps;
  for (const std::string& name : kArchitectures) maps.push_back("model." + name);
  return maps;
}

// Where errors are reported: the text's source, and which keys came from which override.
class Context {
 public:
  explicit Context(const std::string& source) : source_(source) {}

  const std::string& source() const { return source_; }

  void note_override(const std::string& key, const std::string& text) { overrides_[key] = text; }
  const std::map<std::string, std::string>& overrides() const { return overrides_; }

  // What validate() accepts for a key, in the words of its error message; kept only while the
  // configuration reference is being generated (rules_ set).
  void allow(const std::string& key, const std::string& rule) const {
    if (rules_ != nullptr) (*rules_)[key] = rule;
  }
  void record_rules_into(std::map<std::string, std::string>* rules) { rules_ = rules; }

  [[noreturn]] void fail_value(const std::string& key, const std::string& value,
                               const std::string& problem) const {
    fail("config error in {}: {} = {}: {}{}", source_, key, value, problem, origin(key));
  }
  [[noreturn]] void fail_range(const std::string& key, const std::string& value,
                               const std::string& allowed) const {
    fail("config error in {}: {} = {} is out of range; allowed: {}{}", source_, key, value,
         allowed, origin(key));
  }
  // A kept map's rule: "<key> = <value> is out of range: <problem>", the owner's own words.
  [[noreturn]] void fail_rule(const std::string& key, const std::string& value,
                              const std::string& problem) const {
    fail("config error in {}: {} = {} is out of range: {}{}", source_, key, value, problem,
         origin(key));
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
  std::map<std::string, std::string>* rules_ = nullptr;
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
std::string unknown_key_message(const std::string& full_key, const std::vector<Key>& keys,
                                const std::vector<std::string>& maps) {
  // A name on the path exists when it is a listed map, holds a key or is a key. The first that
  // does not is what is unknown: an override of trainng.lr is about the section trainng.
  auto exists = [&](const std::string& m) {
    auto holds = [&](const Key& k) { return parent_of(k.name) == m || k.name == m; };
    return std::find(maps.begin(), maps.end(), m) != maps.end() ||
           std::any_of(keys.begin(), keys.end(), holds);
  };
  std::string key = full_key;
  while (!parent_of(key).empty() && !exists(parent_of(key))) key = parent_of(key);
  const std::string map = parent_of(key);
  const std::string name = leaf_of(key);
  std::vector<std::string> siblings;  // names allowed in `map`
  for (const Key& k : keys) {
    if (parent_of(k.name) == map) siblings.push_back(leaf_of(k.name));
  }
  for (const std::string& m : maps) {
    if (parent_of(m) == map) siblings.push_back(leaf_of(m));
  }
  if (map == "training") siblings.push_back("lr");

  std::vector<std::string> elsewhere;
  for (const Key& k : keys) {
    if (leaf_of(k.name) == name && parent_of(k.name) != map) elsewhere.push_back(k.name);
  }
  for (const std::string& m : maps) {
    if (leaf_of(m) == name && parent_of(m) != map) elsewhere.push_back(m);
  }
  return unknown_name_message(key, siblings, elsewhere);
}

// Reads a YAML tree into a Config, checking each value's type (ranges come later, in validate).
class Reader {
 public:
  // `maps`: the maps that hold `keys`; `kept`: the configuration whose objective.<x> and
  // model.<architecture> maps are kept (null when reading one such map).
  Reader(const Context& context, std::vector<Key> keys, std::vector<std::string> maps,
         Config* kept = nullptr)
      : context_(context), keys_(std::move(keys)), maps_(std::move(maps)), kept_(kept) {}

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

  const Key* find(const std::string& name) const {
    for (const Key& key : keys_) {
      if (key.name == name) return &key;
    }
    return nullptr;
  }

  const std::vector<Key>& keys() const { return keys_; }

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
      if (const Key* target = find(canonical)) {
        read_value(*target, value);
      } else if (kept_ != nullptr && is_kept_section(key)) {
        keep_section(key, value);
      } else if (std::find(maps_.begin(), maps_.end(), key) != maps_.end()) {
        read_section(value, key);  // "section:" with nothing under it keeps the defaults
      } else {
        context_.fail_text(unknown_key_message(key, keys_, maps_));
      }
    }
  }

  // objective.<x> is kept as YAML text for the objective named x to read (config_section.h),
  // whether x names an objective being the objective registry's check; model.<architecture> for
  // that architecture's entry of the draft registry.
  void keep_section(const std::string& key, const YAML::Node& value) {
    const bool objective = is_objective_section(key);
    if (!value.IsNull() && !value.IsMap()) {
      std::string problem =
          fmt::format("{} settings must be a map, got {}",
                      objective ? "an objective's" : "an architecture's", describe_kind(value));
      if (objective && !closest_candidate(leaf_of(key), {leaf_of(kObjectiveName)}).empty()) {
        problem += fmt::format("; did you mean {}?", kObjectiveName);
      }
      context_.fail_value(key, show(value), problem);
    }
    YAML::Emitter text;
    text << (value.IsNull() ? YAML::Node(YAML::NodeType::Map) : value);
    auto& sections = objective ? kept_->objective.sections : kept_->model.sections;
    sections[leaf_of(key)] = text.c_str();
  }

  void read_value(const Key& key, const YAML::Node& node) const {
    std::visit([&](auto* target) { read_into(key, node, *target); }, key.target);
  }

  [[noreturn]] void fail_type(const Key& key, const YAML::Node& node,
                              const std::string& expected) const {
    context_.fail_value(key.name, show(node),
                        fmt::format("{}, got {}", expected, describe_kind(node)));
  }

  int64_t parse_int(const Key& key, const std::string& name, const YAML::Node& node) const {
    // The reference's first DSpine rule: integers and not bools, so 2.5 and 1024.0 fail.
    const std::string expected =
        is_dspine_key(key.name) ? fmt::format("DSpine {} must be an integer", leaf_of(key.name))
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

  void read_into(const Key& key, const YAML::Node& node, int64_t& out) const {
    out = parse_int(key, key.name, node);
  }

  void read_into(const Key& key, const YAML::Node& node, double& out) const {
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
      context_.fail_value(key.name, show(node),
                          is_dspine_key(key.name)
                              ? fmt::format("DSpine {} must be finite", leaf_of(key.name))
                              : std::string("must be a finite number"));
    }
  }

  void read_into(const Key& key, const YAML::Node& node, std::string& out) const {
    if (!node.IsScalar()) fail_type(key, node, "expected a string");
    std::string value = node.Scalar();
    if (key.accepts_bool && is_plain_scalar(node) && is_bool_literal(value)) {
      std::transform(value.begin(), value.end(), value.begin(), ::tolower);
    }
    const std::vector<std::string> choices = allowed_choices(key);
    if (!choices.empty() && std::find(choices.begin(), choices.end(), value) == choices.end()) {
      context_.fail_value(key.name, show(node), "not an allowed value; allowed: " + join(choices));
    }
    out = value;
  }

  // A closed choice: read as a string checked against the enum's spellings, then mapped.
  template <typename E, typename = std::enable_if_t<std::is_enum_v<E>>>
  void read_into(const Key& key, const YAML::Node& node, E& out) const {
    std::string name;
    read_into(key, node, name);
    for (const Choice<E>& choice : choices_of(out)) {
      if (name == choice.name) out = choice.value;
    }
  }

  void read_into(const Key& key, const YAML::Node& node, bool& out) const {
    if (!is_plain_scalar(node) || !is_bool_literal(node.Scalar())) {
      fail_type(key, node, "expected a boolean (true or false)");
    }
    out = node.Scalar()[0] == 't' || node.Scalar()[0] == 'T';
  }

  void read_into(const Key& key, const YAML::Node& node, std::vector<int64_t>& out) const {
    if (!node.IsSequence()) fail_type(key, node, "expected a list of integers");
    std::vector<int64_t> values;
    for (size_t i = 0; i < node.size(); ++i) {
      values.push_back(parse_int(key, fmt::format("{}[{}]", key.name, i), node[i]));
    }
    out = values;
  }

  const Context& context_;
  std::vector<Key> keys_;
  std::vector<std::string> maps_;
  Config* kept_;
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

// objective.<section>.<key...> or model.<architecture>.<key...>: a kept map's setting, checked
// when its owner reads the map.
bool is_kept_setting(const std::vector<std::string>& parts) {
  return parts.size() >= 3 && is_kept_section(parts[0] + "." + parts[1]);
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
  if (std::find(kMaps.begin(), kMaps.end(), key) != kMaps.end() || is_kept_section(key)) {
    context.fail_text(fmt::format("override '{}' names the map {}, not a key; set its keys one "
                                  "at a time",
                                  text, key));
  }
  if (const std::string new_key = moved_to(key); !new_key.empty()) {
    warn_moved(context, key, new_key);
    key = new_key;
    parts = split(key, '.');
  }
  if (key != kLrAlias && reader.find(key) == nullptr && !is_kept_setting(parts)) {
    context.fail_text(fmt::format("override '{}': {}", text,
                                  unknown_key_message(key, reader.keys(), known_maps())));
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

// A separate held-out source must be of the training source's kind: it is read through the same
// target (data/batch_source.h, make_held_out_source).
void validate_held_out_source(const Context& ctx, const DataConfig& data) {
  struct HeldOutKey {
    const char* key;
    DataSource source;  // the data.source it belongs to
    const char* what;
    const std::string* value;
  };
  for (const auto& [key, source, what, value] :
       {HeldOutKey{"data.eval_samples_file", DataSource::kTarget, "token-sample JSONL file",
                   &data.eval_samples_file},
        HeldOutKey{"data.eval_shards_dir", DataSource::kShards, "shard directory",
                   &data.eval_shards_dir},
        HeldOutKey{"data.eval_specforge_dir", DataSource::kSpecforge, "SpecForge sample directory",
                   &data.eval_specforge_dir}}) {
    ctx.allow(key,
              fmt::format("\"\" or, with data.source {}, a held-out {}", to_string(source), what));
    if (!value->empty() && data.source != source) {
      ctx.fail_value(key, show(*value),
                     fmt::format("data.source is {}; this key is for data.source {}",
                                 to_string(data.source), to_string(source)));
    }
  }
}

// The range rules of validate(): each records its rule for the key and fails a value outside.
struct RangeRules {
  const Context& ctx;
  void at_least(const std::string& key, int64_t value, int64_t low) const {
    const std::string rule = fmt::format("integer >= {}", low);
    ctx.allow(key, rule);
    if (value < low) ctx.fail_range(key, show(value), rule);
  }
  void positive(const std::string& key, double value) const {
    ctx.allow(key, "number > 0");
    if (!(value > 0)) ctx.fail_range(key, show(value), "number > 0");
  }
  void nonnegative(const std::string& key, double value) const {
    ctx.allow(key, "number >= 0");
    if (!(value >= 0)) ctx.fail_range(key, show(value), "number >= 0");
  }
  void fraction(const std::string& key, double value) const {  // [0, 1)
    ctx.allow(key, "number in [0, 1)");
    if (!(value >= 0 && value < 1)) ctx.fail_range(key, show(value), "number in [0, 1)");
  }
  // `key` (>= 1 by its own rule) must be a multiple of `divisor_key` (the grouped-query heads).
  void multiple_of(const std::string& key, int64_t value, const std::string& divisor_key,
                   int64_t divisor) const {
    ctx.allow(key, "integer >= 1, a multiple of " + divisor_key);
    if (value % divisor != 0) {
      ctx.fail_range(key, show(value), fmt::format("a multiple of {} = {}", divisor_key, divisor));
    }
  }
  void non_empty(const std::string& key, const std::string& value) const {
    ctx.allow(key, "not empty");
    if (value.empty()) ctx.fail_value(key, show(value), "must not be empty");
  }
};

void validate_model(const RangeRules& r, const Config& c) {
  const ModelConfig& m = c.model;
  r.at_least("model.hidden_size", m.hidden_size, 1);
  r.at_least("model.intermediate_size", m.intermediate_size, 1);
  r.at_least("model.num_hidden_layers", m.num_hidden_layers, 1);
  r.at_least("model.num_attention_heads", m.num_attention_heads, 1);
  r.at_least("model.num_key_value_heads", m.num_key_value_heads, 1);
  r.at_least("model.head_dim", m.head_dim, 1);
  r.at_least("model.vocab_size", m.vocab_size, 1);
  r.multiple_of("model.num_attention_heads", m.num_attention_heads, "model.num_key_value_heads",
                m.num_key_value_heads);
  r.positive("model.rms_norm_eps", m.rms_norm_eps);
  r.positive("model.rope_theta", m.rope_theta);
  r.nonnegative("model.initializer_range", m.initializer_range);
  r.at_least("model.block_size", m.block_size, 2);
  r.ctx.allow("model.mask_token_id",
              "-1 (the last vocabulary id) or an id in [0, model.vocab_size)");
  if (m.mask_token_id < -1 || m.mask_token_id >= m.vocab_size) {
    r.ctx.fail_range(
        "model.mask_token_id", show(m.mask_token_id),
        fmt::format("-1 (the last vocabulary id) or an id in [0, model.vocab_size = {})",
                    m.vocab_size));
  }
  r.ctx.allow("model.target_layer_ids",
              "at least one layer id >= 0; with data.source synthetic, each < "
              "data.synthetic.num_layers");
  if (m.target_layer_ids.empty()) {
    r.ctx.fail_value("model.target_layer_ids", "[]", "must list at least one target layer");
  }
  const bool synthetic = c.data.source == DataSource::kSynthetic;
  r.at_least("model.num_target_layers", m.num_target_layers, 0);
  for (size_t i = 0; i < m.target_layer_ids.size(); ++i) {
    const int64_t id = m.target_layer_ids[i];
    const std::string key = fmt::format("model.target_layer_ids[{}]", i);
    if (id < 0) r.ctx.fail_range(key, show(id), "integer >= 0");
    if (m.num_target_layers > 0 && id >= m.num_target_layers) {
      r.ctx.fail_range(key, show(id),
                       fmt::format("a layer of the target, in [0, model.num_target_layers = {})",
                                   m.num_target_layers));
    }
    if (synthetic && id >= c.data.synthetic.num_layers) {
      r.ctx.fail_range(key, show(id),
                       fmt::format("a layer of the synthetic target, in [0, "
                                   "data.synthetic.num_layers = {})",
                                   c.data.synthetic.num_layers));
    }
  }
}

void validate_data(const RangeRules& r, const DataConfig& data) {
  r.ctx.allow("data.shards_dir",
              "a directory written by dspine-data generate; needed when data.source is shards");
  r.ctx.allow("data.target.path", "a Hugging Face Qwen3 directory; needed by target and specforge");
  r.ctx.allow("data.samples", "a token-sample JSONL file; needed by target unless target.random");
  r.ctx.allow("data.specforge_dir", "a directory of SpecForge samples; needed by specforge");
  if (data.source == DataSource::kShards && data.shards_dir.empty()) {
    r.ctx.fail_value("data.shards_dir", show(data.shards_dir),
                     "data.source is shards, which needs the directory written by dspine-data "
                     "generate");
  }
  if ((data.source == DataSource::kTarget || data.source == DataSource::kSpecforge) &&
      data.target.path.empty()) {
    r.ctx.fail_value("data.target.path", show(data.target.path),
                     fmt::format("data.source is {}, which needs the target's Hugging Face "
                                 "directory",
                                 to_string(data.source)));
  }
  if (data.source == DataSource::kTarget && data.samples.empty() && !data.target.random) {
    r.ctx.fail_value("data.samples", show(data.samples),
                     "data.source is target, which needs a token-sample JSONL file (random token "
                     "ids only with data.target.random: true)");
  }
  if (data.source == DataSource::kSpecforge && data.specforge_dir.empty()) {
    r.ctx.fail_value("data.specforge_dir", show(data.specforge_dir),
                     "data.source is specforge, which needs a directory of SpecForge samples");
  }
  r.at_least("data.target.seed", data.target.seed, 0);
  r.at_least("data.seq_len", data.seq_len, 2);
  r.at_least("data.eval_samples", data.eval_samples, 1);
  r.ctx.allow("data.eval_offset",
              "integer >= 0, or -1 for the first sample past the training data");
  if (data.eval_offset < -1) {
    r.ctx.fail_range("data.eval_offset", show(data.eval_offset),
                     "integer >= 0, or -1 for the first sample past the training data");
  }
  validate_held_out_source(r.ctx, data);
}

void validate_synthetic(const RangeRules& r, const DataConfig& data) {
  const SyntheticTargetConfig& s = data.synthetic;
  r.at_least("data.synthetic.seed", s.seed, 0);
  r.at_least("data.synthetic.num_layers", s.num_layers, 1);
  r.at_least("data.synthetic.num_attention_heads", s.num_attention_heads, 1);
  r.at_least("data.synthetic.num_key_value_heads", s.num_key_value_heads, 1);
  r.at_least("data.synthetic.head_dim", s.head_dim, 1);
  r.at_least("data.synthetic.intermediate_size", s.intermediate_size, 1);
  r.multiple_of("data.synthetic.num_attention_heads", s.num_attention_heads,
                "data.synthetic.num_key_value_heads", s.num_key_value_heads);
  r.positive("data.synthetic.logit_scale", s.logit_scale);
  r.positive("data.synthetic.temperature", s.temperature);
  r.ctx.allow("data.synthetic.prompt_length", "integer in [0, data.seq_len)");
  if (s.prompt_length < 0 || s.prompt_length >= data.seq_len) {
    r.ctx.fail_range("data.synthetic.prompt_length", show(s.prompt_length),
                     fmt::format("integer in [0, data.seq_len = {})", data.seq_len));
  }
}

void validate_run(const RangeRules& r, const Config& c) {
  const TrainingConfig& t = c.training;
  r.at_least("training.batch_size", t.batch_size, 1);
  r.at_least("training.accumulation_steps", t.accumulation_steps, 1);
  r.at_least("training.total_steps", t.total_steps, 1);
  r.positive("training.learning_rate", t.learning_rate);
  r.fraction("training.warmup_ratio", t.warmup_ratio);
  r.nonnegative("training.max_grad_norm", t.max_grad_norm);
  r.nonnegative("training.weight_decay", t.weight_decay);
  r.fraction("training.adam_beta1", t.adam_beta1);
  r.fraction("training.adam_beta2", t.adam_beta2);
  r.positive("training.adam_eps", t.adam_eps);
  r.at_least("training.seed", t.seed, 0);
  r.at_least("training.cpu_threads", t.cpu_threads, 0);
  r.at_least("training.eval_every", t.eval_every, 0);
  r.at_least("training.eval_decode_tokens", t.eval_decode_tokens, 0);
  r.at_least("training.eval_decode_prompt_tokens", t.eval_decode_prompt_tokens, 0);
  r.nonnegative("training.eval_decode_temperature", t.eval_decode_temperature);

  r.non_empty("checkpoint.dir", c.checkpoint.dir);
  r.at_least("checkpoint.save_every", c.checkpoint.save_every, 0);
  r.at_least("checkpoint.keep_last", c.checkpoint.keep_last, 0);
  r.non_empty("checkpoint.resume", c.checkpoint.resume);
  r.at_least("logging.every", c.logging.every, 1);
  r.positive("distributed.timeout_s", c.distributed.timeout_s);
}

// Range and cross-key checks on a fully read configuration, section by section (the first
// failure is reported, so the order is the order of the file's sections).
void validate(const Context& ctx, const Config& c) {
  const RangeRules rules{ctx};
  validate_model(rules, c);
  validate_data(rules, c.data);
  validate_synthetic(rules, c.data);
  validate_run(rules, c);
}

}  // namespace

Config parse_config(const std::string& yaml_text, const std::string& source,
                    const std::vector<std::string>& overrides) {
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
  Reader reader(context, keys_of(config), known_maps(), &config);
  for (const std::string& text : overrides) apply_override(root, text, context, reader);
  move_legacy_keys(root, context);
  reader.read_root(root);
  validate(context, config);
  config.overrides = context.overrides();
  return config;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (path.empty()) return parse_config(kEmbeddedDefaultConfig, "<embedded default>", overrides);
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    fail("config error: cannot read config file '{}': it is a directory", path);
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("config error: cannot read config file '{}': {}", path, std::strerror(errno));
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) fail("config error: cannot read config file '{}': read failed", path);
  return parse_config(text.str(), path, overrides);
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

std::string to_yaml(const Config& config) {
  Config copy = config;  // keys_of() hands out mutable pointers; to_yaml only reads them
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::vector<std::string> open;  // the maps currently open, e.g. {"model", "dspine"}
  // The kept maps, verbatim: an architecture's as its registry entry resolved it
  // (model/draft_registry.h: resolve_drafts), every key with its value.
  auto write_kept = [&](const std::map<std::string, std::string>& sections) {
    for (const auto& [section, text] : sections) {
      out << YAML::Key << section << YAML::Value << YAML::Load(text);
    }
  };
  auto close_map = [&] {
    if (open == std::vector<std::string>{"model"}) write_kept(config.model.sections);
    if (open == std::vector<std::string>{"objective"}) write_kept(config.objective.sections);
    out << YAML::EndMap;
    open.pop_back();
  };
  for (const Key& key : keys_of(copy)) {
    std::vector<std::string> path = split(key.name, '.');
    const std::string leaf = path.back();
    path.pop_back();
    size_t common = 0;
    while (common < open.size() && common < path.size() && open[common] == path[common]) ++common;
    while (open.size() > common) close_map();
    while (open.size() < path.size()) {
      const std::string& name = path[open.size()];
      out << YAML::Key << name << YAML::Value << YAML::BeginMap;
      open.push_back(name);
    }
    out << YAML::Key << leaf << YAML::Value;
    std::visit(
        [&](auto* value) {
          using T = std::decay_t<decltype(*value)>;
          if constexpr (std::is_same_v<T, std::string>) {
            out << YAML::DoubleQuoted << *value;
          } else if constexpr (std::is_enum_v<T>) {
            out << YAML::DoubleQuoted << to_string(*value);
          } else if constexpr (std::is_same_v<T, bool>) {
            out << YAML::TrueFalseBool << *value;
          } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
            out << YAML::Flow << YAML::BeginSeq;
            for (int64_t v : *value) out << show(v);
            out << YAML::EndSeq;
          } else {
            out << show(*value);  // doubles: shortest text that reads back to the same value
          }
        },
        key.target);
  }
  while (!open.empty()) close_map();
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

namespace {

std::string type_name(const Target& target) {
  return std::visit(
      [](auto* value) -> std::string {
        using T = std::decay_t<decltype(*value)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          return "integer";
        } else if constexpr (std::is_same_v<T, double>) {
          return "number";
        } else if constexpr (std::is_same_v<T, bool>) {
          return "boolean";
        } else if constexpr (std::is_same_v<T, std::string> || std::is_enum_v<T>) {
          return "string";
        } else {
          return "list of integers";
        }
      },
      target);
}

std::string value_text(const Target& target) {
  return std::visit(
      [](auto* value) -> std::string {
        using T = std::decay_t<decltype(*value)>;
        if constexpr (std::is_same_v<T, bool>) {
          return *value ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          std::vector<std::string> items;
          for (int64_t v : *value) items.push_back(show(v));
          return "[" + join(items) + "]";
        } else if constexpr (std::is_enum_v<T>) {
          return show(to_string(*value));
        } else {
          return show(*value);
        }
      },
      target);
}

KeyFacts facts_of(const Key& key, const std::string& rule) {
  const std::vector<std::string> choices = allowed_choices(key);
  const std::string allowed = choices.empty() ? rule : join(choices);
  return {key.name, type_name(key.target), value_text(key.target), allowed, ""};
}

}  // namespace

std::vector<KeyFacts> core_key_facts() {
  Config defaults;
  std::map<std::string, std::string> rules;
  Context context("<defaults>");
  context.record_rules_into(&rules);
  validate(context, defaults);
  std::vector<KeyFacts> facts;
  for (const Key& key : keys_of(defaults)) {
    auto rule = rules.find(key.name);
    facts.push_back(facts_of(key, rule == rules.end() ? "" : rule->second));
  }
  return facts;
}

// config_section.h: a kept map (an objective's own), read with the same Reader as every other key.
namespace {

thread_local SettingsRecorder* active_recorder = nullptr;

Context context_of(const Config& config) {
  Context context(config.source.empty() ? "<config>" : config.source);
  for (const auto& [key, text] : config.overrides) context.note_override(key, text);
  return context;
}

// The text parse_config kept for the map `map` (Reader::keep_section), null when the
// configuration does not give it.
const std::string* kept_text(const Config& config, const std::string& map) {
  if (is_kept_section(map)) {
    const auto& sections =
        is_objective_section(map) ? config.objective.sections : config.model.sections;
    const auto text = sections.find(leaf_of(map));
    return text == sections.end() ? nullptr : &text->second;
  }
  fail("config: {} is not a map kept for its owner to read", map);
}

}  // namespace

SettingsRecorder::SettingsRecorder() : previous_(active_recorder) { active_recorder = this; }

SettingsRecorder::~SettingsRecorder() { active_recorder = previous_; }

void read_section(const Config& config, const std::string& map,
                  const std::vector<SettingKey>& keys) {
  if (active_recorder != nullptr) {
    for (const SettingKey& key : keys) {
      Key full{map + "." + key.name, target_of(key.target), key.choices, key.accepts_bool};
      KeyFacts facts = facts_of(full, "");
      facts.description = key.description;
      active_recorder->facts_.push_back(std::move(facts));
    }
  }
  const std::string* text = kept_text(config, map);
  if (text == nullptr) return;
  const Context context = context_of(config);
  YAML::Node node;
  try {
    node = YAML::Load(*text);
  } catch (const YAML::ParserException& e) {
    context.fail_text(fmt::format("{}: the settings are not valid YAML: {}", map, e.msg));
  }
  std::vector<Key> full_keys;
  for (const SettingKey& key : keys) {
    full_keys.push_back(
        {map + "." + key.name, target_of(key.target), key.choices, key.accepts_bool});
  }
  // The map itself is known even when it takes no keys (objective.ce).
  Reader(context, std::move(full_keys), {map}).read_section(node, map);
}

void objective_range_error(const Config& config, const std::string& key, const std::string& value,
                           const std::string& allowed) {
  context_of(config).fail_range(key, value, allowed);
}

void check_rule(const Config& config, const std::string& key, bool ok, const std::string& value,
                const std::string& allowed, const std::string& problem) {
  SettingsRecorder::record_allowed(key, allowed);
  if (!ok) context_of(config).fail_rule(key, value, problem);
}

const std::vector<std::string>& architecture_names() { return kArchitectures; }

void SettingsRecorder::record_allowed(const std::string& key, const std::string& allowed) {
  if (active_recorder == nullptr) return;
  for (KeyFacts& facts : active_recorder->facts_) {
    if (facts.key == key && facts.allowed.empty()) facts.allowed = allowed;
  }
}

void check_setting(const Config& config, const std::string& key, bool ok, const std::string& value,
                   const std::string& allowed) {
  SettingsRecorder::record_allowed(key, allowed);
  if (!ok) objective_range_error(config, key, value, allowed);
}

std::string closest_name(const std::string& name, const std::vector<std::string>& candidates) {
  return closest_candidate(name, candidates);
}

void unknown_objective_section_error(const Config& config, const std::string& section,
                                     const std::vector<std::string>& objectives) {
  std::vector<std::string> names = {leaf_of(kObjectiveName)};
  names.insert(names.end(), objectives.begin(), objectives.end());
  context_of(config).fail_text(unknown_name_message("objective." + section, names, {}));
}

}  // namespace dspine::core
