#include "data/hf_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/safetensors.h"

namespace dspine::data {
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
  if (present(json, "rope_scaling")) {
    fail("{}: rope_scaling {} is not supported (only plain RoPE: null)", path,
         json.at("rope_scaling").dump());
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
  dims.rope_theta = number_key(json, "rope_theta", path, 10000.0);
  dims.tie_word_embeddings = bool_key(json, "tie_word_embeddings", path, false);
  check_qwen3_dims(dims, path);
  return dims;
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

}  // namespace dspine::data
