#include "model/hf_draft_config.h"

#include <fstream>
#include <functional>
#include <iterator>
#include <vector>

#include <fmt/ranges.h>

#include "core/error.h"
#include "model/dspine_config.h"

namespace dspine::model {

namespace {

using nlohmann::json;

constexpr int64_t kLargest = (int64_t{1} << 31) - 1;

// The value at `pointer` ("/dflash_config/block_size"), or null when absent.
const json& value_at(const json& hf, const std::string& pointer) {
  static const json absent;
  const json::json_pointer at(pointer);
  return hf.contains(at) ? hf.at(at) : absent;
}

std::string key_name(const std::string& pointer) {
  std::string name = pointer.substr(1);
  for (char& c : name) c = c == '/' ? '.' : c;
  return name;
}

int64_t integer(const json& hf, const std::string& pointer, const std::string& path) {
  const json& value = value_at(hf, pointer);
  if (value.is_null()) fail("{}: has no key {}", path, key_name(pointer));
  if (!value.is_number_integer()) {
    fail("{}: {} must be an integer (got {})", path, key_name(pointer), value.dump());
  }
  // Sizes multiply into tensor shapes; a value past int32 is no draft's and would overflow.
  const bool large = value.is_number_unsigned()
                         ? value.get<uint64_t>() > static_cast<uint64_t>(kLargest)
                         : value.get<int64_t>() < -kLargest || value.get<int64_t>() > kLargest;
  if (large) {
    fail("{}: {} is {}, beyond any draft's sizes (at most {})", path, key_name(pointer),
         value.dump(), kLargest);
  }
  return value.get<int64_t>();
}

int64_t integer_or(const json& hf, const std::string& pointer, int64_t fallback,
                   const std::string& path) {
  return value_at(hf, pointer).is_null() ? fallback : integer(hf, pointer, path);
}

double number_or(const json& hf, const std::string& pointer, double fallback,
                 const std::string& path) {
  const json& value = value_at(hf, pointer);
  if (value.is_null()) return fallback;
  if (!value.is_number()) {
    fail("{}: {} must be a number (got {})", path, key_name(pointer), value.dump());
  }
  return value.get<double>();
}

// The RoPE base from either layout: transformers 5 writes rope_parameters.rope_theta, older
// versions a top-level rope_theta (and rope_scaling, which transformers 5 reads as
// rope_parameters). Where several are given they must agree. The draft's RoPE is plain
// (model/rope.cpp), so a dictionary of any other rope_type is refused.
double rope_theta_of(const json& hf, double fallback, const std::string& path) {
  for (const std::string rope : {"/rope_parameters", "/rope_scaling"}) {
    const json& value = value_at(hf, rope);
    if (value.is_null()) continue;
    if (!value.is_object()) {
      fail("{}: {} must be an object or null (got {})", path, key_name(rope), value.dump());
    }
    for (const std::string type : {"/rope_type", "/type"}) {
      const std::string pointer = rope + type;  // named: g++ 13 takes a temporary for dangling
      const json& name = value_at(hf, pointer);
      if (!name.is_null() && name != "default") {
        fail("{}: {} is {}; the draft's RoPE is plain (\"default\")", path, key_name(pointer),
             name.dump());
      }
    }
  }
  double theta = fallback;
  std::string source;
  for (const std::string pointer : {"/rope_theta", "/rope_parameters/rope_theta",
                                    "/rope_scaling/rope_theta"}) {
    if (value_at(hf, pointer).is_null()) continue;
    const double value = number_or(hf, pointer, fallback, path);
    if (!source.empty() && value != theta) {
      fail("{}: {} is {} but {} is {}; they must agree", path, key_name(source),
           value_at(hf, source).dump(), key_name(pointer), value_at(hf, pointer).dump());
    }
    theta = value;
    source = pointer;
  }
  return theta;
}

// What the draft does not implement: it must be the causal, bias-free, full-attention
// DSpineDraftModel of a Qwen3Config.
void check_supported(const json& hf, const std::string& path) {
  if (value_at(hf, "/architectures") != json::array({"DSpineDraftModel"})) {
    fail("{}: architectures is {}, expected [\"DSpineDraftModel\"] (not a DSpine draft)", path,
         value_at(hf, "/architectures").dump());
  }
  if (value_at(hf, "/model_type") != "qwen3") {
    fail("{}: model_type is {}, expected \"qwen3\"", path, value_at(hf, "/model_type").dump());
  }
  const json& causal = value_at(hf, "/is_causal");
  if (causal == false) fail("{}: DSpine requires causal attention; is_causal=false is unsupported", path);
  if (!causal.is_null() && !causal.is_boolean()) {
    fail("{}: is_causal must be a boolean or null (got {})", path, causal.dump());
  }
  if (value_at(hf, "/attention_bias") == true) {
    fail("{}: attention_bias true is unsupported (the draft's projections have no bias)", path);
  }
  const json& hidden_act = value_at(hf, "/hidden_act");
  if (!hidden_act.is_null() && hidden_act != "silu") {
    fail("{}: hidden_act is {}, the draft's MLP is SiLU-gated (\"silu\")", path, hidden_act.dump());
  }
  const json& types = value_at(hf, "/layer_types");
  if (!types.is_array()) {
    fail("{}: layer_types must be a list with one entry per layer (got {})", path, types.dump());
  }
  for (const auto& type : types) {
    if (type != "full_attention") {
      fail("{}: layer_types holds {}; only full_attention layers are supported", path, type.dump());
    }
  }
  const json& dspine = value_at(hf, "/dspine_config");
  if (!dspine.is_null() && !dspine.is_object()) {
    fail("{}: dspine_config must be an object (got {})", path, dspine.dump());
  }
}

}  // namespace

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) fail("{}: cannot be read", path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_json_object(text, path);
}

json parse_json_object(const std::string& text, const std::string& path) {
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) fail("{}: is not valid JSON", path);
  if (!value.is_object()) fail("{}: expected a JSON object", path);
  return value;
}

DSpineModelConfig model_config_from_hf(const json& hf, const std::string& path) {
  check_supported(hf, path);
  DSpineModelConfig c;
  c.architecture = "dspine";
  c.hidden_size = integer(hf, "/hidden_size", path);
  c.intermediate_size = integer(hf, "/intermediate_size", path);
  c.num_hidden_layers = integer(hf, "/num_hidden_layers", path);
  c.num_attention_heads = integer(hf, "/num_attention_heads", path);
  c.num_key_value_heads = integer(hf, "/num_key_value_heads", path);
  c.head_dim = integer(hf, "/head_dim", path);
  c.vocab_size = integer(hf, "/vocab_size", path);
  c.rms_norm_eps = number_or(hf, "/rms_norm_eps", c.rms_norm_eps, path);
  c.rope_theta = rope_theta_of(hf, c.rope_theta, path);
  c.initializer_range = number_or(hf, "/initializer_range", c.initializer_range, path);
  c.block_size = value_at(hf, "/block_size").is_null()
                     ? integer(hf, "/dflash_config/block_size", path)
                     : integer(hf, "/block_size", path);
  c.mask_token_id = integer(hf, "/dflash_config/mask_token_id", path);
  const json& ids = value_at(hf, "/dflash_config/target_layer_ids");
  if (!ids.is_array()) fail("{}: dflash_config.target_layer_ids must be a list of integers", path);
  c.target_layer_ids.clear();
  for (const auto& id : ids) {
    if (!id.is_number_integer()) {
      fail("{}: dflash_config.target_layer_ids holds {}, not an integer", path, id.dump());
    }
    c.target_layer_ids.push_back(id.get<int64_t>());
  }
  auto& d = c.dspine;
  d.transfer_rank = integer_or(hf, "/dspine_config/transfer_rank", d.transfer_rank, path);
  d.message_size = integer_or(hf, "/dspine_config/message_size", d.message_size, path);
  d.top_k = integer_or(hf, "/dspine_config/top_k", d.top_k, path);
  d.replacement_layers = integer_or(hf, "/dspine_config/replacement_layers", d.replacement_layers, path);
  const json& layer_types = value_at(hf, "/layer_types");
  if (static_cast<int64_t>(layer_types.size()) != c.num_hidden_layers) {
    fail("{}: layer_types has {} entries, num_hidden_layers is {}", path, layer_types.size(),
         c.num_hidden_layers);
  }
  try {
    validate_dspine_model_config(c);
  } catch (const Error& e) {
    fail("{}: {}", path, e.what());
  }
  return c;
}

void check_hf_config(const json& hf, const DSpineModelConfig& run, const std::string& path) {
  // Both sides in the canonical form config.json is written in, minus what only training reads.
  auto canonical = [](const DSpineModelConfig& model) {
    json config = dspine_hf_config(model, HfConfigContext{});
    for (const char* key : {"dtype", "initializer_range", "num_target_layers",
                            "max_position_embeddings"}) {
      config.erase(key);
    }
    return config;
  };
  std::vector<std::string> differences;
  std::function<void(const json&, const json&, const std::string&)> compare =
      [&](const json& saved, const json& expected, const std::string& prefix) {
        for (const auto& [key, value] : expected.items()) {
          const json& mine = saved.contains(key) ? saved.at(key) : json();
          if (value.is_object() && mine.is_object()) {
            compare(mine, value, prefix + key + ".");
          } else if (mine != value) {
            differences.push_back(fmt::format("{}{} is {}, the run's model has {}", prefix, key,
                                              mine.dump(), value.dump()));
          }
        }
      };
  compare(canonical(model_config_from_hf(hf, path)), canonical(run), "");
  if (!differences.empty()) {
    fail("{}: describes another draft than this run's: {}", path, fmt::join(differences, "; "));
  }
}

}  // namespace dspine::model
