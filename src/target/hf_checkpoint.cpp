#include "target/hf_checkpoint.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/safetensors.h"

namespace dspine::target {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kConfigFile = "config.json";
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

Json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.is_open() || in.bad()) fail("{}: cannot read the file", path);
  try {
    Json json = Json::parse(text);
    if (!json.is_object()) fail("{}: expected a JSON object", path);
    return json;
  } catch (const Json::exception& e) {
    fail("{}: invalid JSON: {}", path, e.what());
  }
}

// A key that is absent or null reads as its default, as in transformers' Qwen3Config.
bool present(const Json& json, const char* key) {
  return json.contains(key) && !json.at(key).is_null();
}

int64_t int_key(const Json& json, const char* key, const std::string& path) {
  if (!present(json, key)) fail("{}: missing key '{}'", path, key);
  const Json& value = json.at(key);
  if (!value.is_number_integer() || value.get<int64_t>() <= 0) {
    fail("{}: '{}' must be a positive integer (got {})", path, key, value.dump());
  }
  return value.get<int64_t>();
}

int64_t int_key(const Json& json, const char* key, const std::string& path, int64_t fallback) {
  return present(json, key) ? int_key(json, key, path) : fallback;
}

double number_key(const Json& json, const char* key, const std::string& path, double fallback) {
  if (!present(json, key)) return fallback;
  const Json& value = json.at(key);
  if (!value.is_number() || !(value.get<double>() > 0.0)) {
    fail("{}: '{}' must be a positive number (got {})", path, key, value.dump());
  }
  return value.get<double>();
}

bool bool_key(const Json& json, const char* key, const std::string& path, bool fallback) {
  if (!present(json, key)) return fallback;
  if (!json.at(key).is_boolean()) {
    fail("{}: '{}' must be true or false (got {})", path, key, json.at(key).dump());
  }
  return json.at(key).get<bool>();
}

void reject_unsupported(const Json& json, const std::string& path) {
  if (!json.contains("model_type") || json.at("model_type") != "qwen3") {
    fail("{}: model_type is {}, only \"qwen3\" is supported", path,
         json.contains("model_type") ? json.at("model_type").dump() : "missing");
  }
  if (bool_key(json, "attention_bias", path, false)) {
    fail("{}: attention_bias true is not supported (Qwen3 has no projection biases)", path);
  }
  if (bool_key(json, "use_sliding_window", path, false)) {
    fail("{}: use_sliding_window true is not supported (full causal attention only)", path);
  }
  if (present(json, "hidden_act") && json.at("hidden_act") != "silu") {
    fail("{}: hidden_act {} is not supported (only \"silu\")", path, json.at("hidden_act").dump());
  }
  if (present(json, "layer_types")) {
    for (const Json& type : json.at("layer_types")) {
      if (type != "full_attention") {
        fail("{}: layer_types entry {} is not supported (only \"full_attention\")", path,
             type.dump());
      }
    }
  }
}

// RoPE. transformers 5 writes rope_parameters {rope_theta, rope_type, ...}; transformers 4 wrote a
// top-level rope_theta and rope_scaling (null for plain RoPE, with "type" for "rope_type" in
// older files). transformers 5 still reads both: rope_scaling as rope_parameters, the top-level
// rope_theta (and partial_rotary_factor) as defaults of rope_parameters' own. Where two places
// give a value they must agree here, since transformers would quietly take one of them.

// Qwen3Config's max_position_embeddings, which YaRN falls back on when config.json has none.
constexpr int64_t kQwen3MaxPositions = 32768;
constexpr double kDefaultRopeTheta = 10000.0;
constexpr const char* kRopeTypes = "\"default\", \"yarn\"";

// What one RoPE dictionary resolves to.
struct RopeRead {
  double theta = kDefaultRopeTheta;
  Qwen3Rope rope;
};

bool same_rope(const RopeRead& a, const RopeRead& b) {
  const Qwen3Rope &x = a.rope, &y = b.rope;
  return a.theta == b.theta && x.type == y.type && x.factor == y.factor &&
         x.attention_factor == y.attention_factor && x.beta_fast == y.beta_fast &&
         x.beta_slow == y.beta_slow && x.truncate == y.truncate &&
         x.original_max_position_embeddings == y.original_max_position_embeddings;
}

// A RoPE dictionary of config.json (rope_parameters or rope_scaling); errors name its keys as
// "<name>.<key>".
struct RopeDict {
  const Json& json;
  const char* name;
  const std::string& path;

  std::string key(const char* k) const { return fmt::format("{}.{}", name, k); }

  int64_t integer(const char* k) const {
    const Json& value = json.at(k);
    if (!value.is_number_integer() || value.get<int64_t>() <= 0) {
      fail("{}: '{}' must be a positive integer (got {})", path, key(k), value.dump());
    }
    return value.get<int64_t>();
  }

  double number(const char* k, double fallback) const {
    if (!present(json, k)) return fallback;
    const Json& value = json.at(k);
    if (!value.is_number() || !(value.get<double>() > 0.0)) {
      fail("{}: '{}' must be a positive number (got {})", path, key(k), value.dump());
    }
    return value.get<double>();
  }

  // rope_type, or the legacy "type"; "default" when neither is there.
  std::string type() const {
    std::string type = "default";
    const char* source = nullptr;
    for (const char* k : {"rope_type", "type"}) {
      if (!json.contains(k)) continue;
      if (!json.at(k).is_string()) {
        fail("{}: '{}' must be a string, one of {} (got {})", path, key(k), kRopeTypes,
             json.at(k).dump());
      }
      if (source != nullptr && json.at(k) != type) {
        fail("{}: '{}' \"{}\" and '{}' {} disagree", path, key(source), type, key(k),
             json.at(k).dump());
      }
      type = json.at(k).get<std::string>();
      source = k;
    }
    if (type != "default" && type != "yarn") {
      fail("{}: '{}' \"{}\" is not supported (supported: {})", path,
           key(source != nullptr ? source : "rope_type"), type, kRopeTypes);
    }
    return type;
  }
};

// transformers rotates only the first partial_rotary_factor of each head under some RoPE types
// and ignores the key under others; Qwen3 rotates whole heads.
void check_partial_rotary_factor(const Json& json, const std::string& path,
                                 const std::string& name) {
  const char* key = "partial_rotary_factor";
  if (present(json, key) && json.at(key) != 1) {
    fail("{}: '{}' {} is not supported (Qwen3 rotates whole heads: 1)", path, name,
         json.at(key).dump());
  }
}

// One RoPE dictionary with the top-level keys of `config` that transformers 5 folds into it.
RopeRead read_rope_dict(const Json& config, const RopeDict& dict) {
  const std::string& path = dict.path;
  const Json& json = dict.json;
  if (!json.is_object()) {
    fail("{}: '{}' must be an object or null (got {})", path, dict.name, json.dump());
  }
  check_partial_rotary_factor(json, path, dict.key("partial_rotary_factor"));
  RopeRead read;
  read.rope.type = dict.type() == "yarn" ? Qwen3Rope::Type::kYarn : Qwen3Rope::Type::kDefault;
  const bool yarn = read.rope.type == Qwen3Rope::Type::kYarn;
  // transformers only warns about keys its RoPE type does not read; a misspelt key, or a
  // dictionary nested by layer type, would then be dropped without a word.
  static const std::set<std::string> plain_keys = {"rope_type", "type", "rope_theta",
                                                   "partial_rotary_factor"};
  static const std::set<std::string> yarn_keys = {
      "rope_type",        "type",
      "rope_theta",       "partial_rotary_factor",
      "factor",           "original_max_position_embeddings",
      "attention_factor", "beta_fast",
      "beta_slow",        "mscale",
      "mscale_all_dim",   "truncate"};
  for (const auto& item : json.items()) {
    if ((yarn ? yarn_keys : plain_keys).count(item.key()) == 0) {
      fail("{}: '{}.{}' is not a key of rope_type \"{}\" (known: {})", path, dict.name, item.key(),
           yarn ? "yarn" : "default", fmt::join(yarn ? yarn_keys : plain_keys, ", "));
    }
  }

  const double top_theta = number_key(config, "rope_theta", path, 0.0);
  read.theta = dict.number("rope_theta", top_theta > 0.0 ? top_theta : kDefaultRopeTheta);
  if (top_theta > 0.0 && read.theta != top_theta) {
    fail("{}: 'rope_theta' {} and '{}' {} disagree", path, config.at("rope_theta").dump(),
         dict.key("rope_theta"), json.at("rope_theta").dump());
  }
  if (!yarn) return read;

  // As transformers' _compute_yarn_parameters and standardize_rope_params resolve them.
  Qwen3Rope& r = read.rope;
  if (!json.contains("factor")) {
    fail(
        "{}: '{}' is missing; YaRN needs it (null: max_position_embeddings / "
        "original_max_position_embeddings)",
        path, dict.key("factor"));
  }
  // A top-level original_max_position_embeddings (as Phi-3 writes it) overrides the dictionary's.
  r.original_max_position_embeddings =
      present(config, "original_max_position_embeddings")
          ? int_key(config, "original_max_position_embeddings", path)
      : present(json, "original_max_position_embeddings")
          ? dict.integer("original_max_position_embeddings")
          : int_key(config, "max_position_embeddings", path, kQwen3MaxPositions);
  r.factor = dict.number(
      "factor", double(int_key(config, "max_position_embeddings", path, kQwen3MaxPositions)) /
                    double(r.original_max_position_embeddings));
  const auto mscale = [&](double m) {
    return r.factor <= 1 ? 1.0 : 0.1 * m * std::log(r.factor) + 1.0;
  };
  const double m = dict.number("mscale", 0.0), m_all = dict.number("mscale_all_dim", 0.0);
  r.attention_factor = dict.number(
      "attention_factor", m > 0.0 && m_all > 0.0 ? mscale(m) / mscale(m_all) : mscale(1.0));
  r.beta_fast = dict.number("beta_fast", 32.0);
  r.beta_slow = dict.number("beta_slow", 1.0);
  // transformers reads truncate with .get("truncate", True): absent is true, null is false.
  if (json.contains("truncate")) {
    const Json& truncate = json.at("truncate");
    if (!truncate.is_null() && !truncate.is_boolean()) {
      fail("{}: '{}' must be true, false or null (got {})", path, dict.key("truncate"),
           truncate.dump());
    }
    r.truncate = truncate.is_boolean() && truncate.get<bool>();
  }
  return read;
}

// dims.rope_theta and dims.rope from either layout.
void read_rope(const Json& config, const std::string& path, Qwen3Dims& dims) {
  check_partial_rotary_factor(config, path, "partial_rotary_factor");
  std::optional<RopeRead> parameters, scaling;
  if (present(config, "rope_parameters")) {
    parameters = read_rope_dict(config, {config.at("rope_parameters"), "rope_parameters", path});
  }
  if (present(config, "rope_scaling")) {
    scaling = read_rope_dict(config, {config.at("rope_scaling"), "rope_scaling", path});
  }
  if (parameters && scaling && !same_rope(*parameters, *scaling)) {
    fail(
        "{}: 'rope_scaling' {} and 'rope_parameters' {} disagree (transformers 5 reads "
        "rope_scaling as rope_parameters: keep one)",
        path, config.at("rope_scaling").dump(), config.at("rope_parameters").dump());
  }
  RopeRead read{number_key(config, "rope_theta", path, kDefaultRopeTheta), Qwen3Rope{}};
  if (parameters) {
    read = *parameters;
  } else if (scaling) {
    read = *scaling;
  }
  dims.rope_theta = read.theta;
  dims.rope = read.rope;
}

void add_file(const std::string& path, Qwen3Weights& weights) {
  if (!fs::is_regular_file(path)) fail("{}: file not found", path);
  for (auto& [name, tensor] : core::load_safetensors(path).tensors) {
    weights.push_back({name, std::move(tensor), path});
  }
}

// The index's weight_map: tensor -> shard file name (a plain name in the directory).
std::map<std::string, std::string> read_weight_map(const std::string& index_path) {
  const Json index = read_json(index_path);
  if (!index.contains("weight_map") || !index.at("weight_map").is_object() ||
      index.at("weight_map").empty()) {
    fail("{}: 'weight_map' must be a non-empty object of tensor name -> file", index_path);
  }
  std::map<std::string, std::string> file_of;
  for (const auto& [name, file] : index.at("weight_map").items()) {
    if (!file.is_string() || file.get<std::string>().empty() ||
        fs::path(file.get<std::string>()).filename() != file.get<std::string>()) {
      fail("{}: weight_map['{}'] must be a plain file name in the directory (got {})", index_path,
           name, file.dump());
    }
    file_of[name] = file.get<std::string>();
  }
  return file_of;
}

Qwen3Weights read_sharded(const fs::path& dir, const std::string& index_path) {
  const std::map<std::string, std::string> file_of = read_weight_map(index_path);
  std::set<std::string> files;
  for (const auto& entry : file_of) files.insert(entry.second);
  Qwen3Weights weights;
  for (const std::string& file : files) {
    const std::string path = (dir / file).string();
    const size_t first = weights.size();
    add_file(path, weights);
    std::set<std::string> held;
    for (size_t i = first; i < weights.size(); ++i) {
      const auto listed = file_of.find(weights[i].name);
      if (listed == file_of.end() || listed->second != file) {
        fail("{}: holds tensor '{}', but {} lists it {}", path, weights[i].name, index_path,
             listed == file_of.end() ? "nowhere" : "in " + listed->second);
      }
      held.insert(weights[i].name);
    }
    for (const auto& [name, listed_file] : file_of) {
      if (listed_file == file && held.count(name) == 0) {
        fail("{}: lists tensor '{}' in {}, which has no such tensor", index_path, name, file);
      }
    }
  }
  return weights;
}

}  // namespace

Qwen3Dims read_qwen3_config(const std::string& config_json_path) {
  const std::string& path = config_json_path;
  const Json json = read_json(path);
  reject_unsupported(json, path);
  Qwen3Dims dims;
  dims.hidden_size = int_key(json, "hidden_size", path);
  dims.intermediate_size = int_key(json, "intermediate_size", path);
  dims.num_hidden_layers = int_key(json, "num_hidden_layers", path);
  dims.num_attention_heads = int_key(json, "num_attention_heads", path);
  dims.num_key_value_heads = int_key(json, "num_key_value_heads", path, dims.num_attention_heads);
  dims.head_dim = int_key(json, "head_dim", path, dims.hidden_size / dims.num_attention_heads);
  dims.vocab_size = int_key(json, "vocab_size", path);
  dims.rms_norm_eps = number_key(json, "rms_norm_eps", path, 1e-6);
  read_rope(json, path, dims);
  dims.tie_word_embeddings = bool_key(json, "tie_word_embeddings", path, false);
  check_qwen3_dims(dims, path);
  return dims;
}

nlohmann::json read_hf_config_json(const std::string& config_json_path) {
  return read_json(config_json_path);
}

Qwen3Weights read_hf_weights(const std::string& dir) {
  const fs::path root(dir);
  const std::string index_path = (root / kIndexFile).string();
  if (fs::exists(index_path)) return read_sharded(root, index_path);
  const std::string single_path = (root / kSingleFile).string();
  if (!fs::exists(single_path)) {
    fail("{}: no {} or {} (a Hugging Face model directory holds one of them)", dir, kSingleFile,
         kIndexFile);
  }
  Qwen3Weights weights;
  add_file(single_path, weights);
  return weights;
}

std::string hf_file_holding(const std::string& dir, const std::string& tensor) {
  const fs::path root(dir);
  const std::string index_path = (root / kIndexFile).string();
  if (!fs::exists(index_path)) return (root / kSingleFile).string();
  const auto file_of = read_weight_map(index_path);
  const auto file = file_of.find(tensor);
  return file == file_of.end() ? "" : (root / file->second).string();
}

Qwen3Model Qwen3Model::load_hf(const std::string& dir, at::ScalarType dtype,
                               const c10::Device& device) {
  const Qwen3Dims dims = read_qwen3_config((fs::path(dir) / kConfigFile).string());
  return from_weights(dims, read_hf_weights(dir), dtype, device, dir);
}

}  // namespace dspine::target
