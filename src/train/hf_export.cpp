#include "train/hf_export.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <system_error>
#include <vector>
#include <unistd.h>

#include <torch/torch.h>

#include "core/checksum.h"
#include "core/error.h"
#include "core/files.h"
#include "core/safetensors.h"
#include "model/dspine_config.h"
#include "model/hf_draft_config.h"
#include "model/state_layout.h"
#include "objectives/dspine_settings.h"
#include "train/checkpoint.h"

namespace dspine::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// dspine_config's training keys, the saved values over the reference defaults; a key that is
// neither the model's nor the objective's is an error.
json training_settings(const json& hf, const std::string& path) {
  json settings = objectives::dspine_settings_json(objectives::DSpineSettings{});
  const std::set<std::string> model_keys = {"transfer_rank", "message_size", "top_k",
                                            "replacement_layers"};
  const json saved = hf.value("dspine_config", json::object());
  for (const auto& [key, value] : saved.items()) {
    if (model_keys.count(key)) continue;
    if (!settings.contains(key)) fail("{}: dspine_config has an unknown key {}", path, key);
    if (!value.is_number() || !std::isfinite(value.get<double>())) {
      fail("{}: DSpine {} must be finite (got {})", path, key, value.dump());
    }
    settings[key] = value;
  }
  return settings;
}

// The saved tensors in the reference order; checks names, shapes, dtypes and values against the
// configuration. Returns the parameters' dtype.
core::NamedTensors reference_tensors(const core::SafetensorsFile& file,
                                     const model::DSpineModelConfig& config, core::Dtype& dtype) {
  const auto layout = model::dspine_state_layout(config);
  std::set<std::string> expected;
  for (const auto& entry : layout) expected.insert(entry.name);
  for (const auto& [name, tensor] : file.tensors) {
    if (!expected.count(name)) fail("{}: holds {}, which is not a DSpine draft tensor", file.path, name);
  }
  core::NamedTensors tensors;
  std::optional<at::ScalarType> parameter_dtype;
  for (const auto& entry : layout) {
    if (!file.contains(entry.name)) fail("{}: has no tensor {}", file.path, entry.name);
    const at::Tensor& tensor = file.at(entry.name);
    if (tensor.sizes() != at::IntArrayRef(entry.shape)) {
      fail("{}: tensor {} has shape {}, config.json implies {}", file.path, entry.name,
           c10::str(tensor.sizes()), c10::str(at::IntArrayRef(entry.shape)));
    }
    if (entry.name == "transfer_ready") {
      if (tensor.scalar_type() != at::kBool) {
        fail("{}: transfer_ready must be a 0-d BOOL tensor (got {})", file.path,
             c10::toString(tensor.scalar_type()));
      }
      if (!tensor.item<bool>()) {
        fail("{}: transfer_ready is false: the draft's transfer space was never built", file.path);
      }
    } else if (!at::isFloatingType(tensor.scalar_type())) {
      fail("{}: tensor {} has dtype {}, expected floating point", file.path, entry.name,
           c10::toString(tensor.scalar_type()));
    } else if (!torch::isfinite(tensor).all().item<bool>()) {
      fail("{}: tensor {} holds NaN or infinite values", file.path, entry.name);
    }
    if (entry.name != "transfer_codes" && entry.name != "transfer_ready") {
      if (parameter_dtype && *parameter_dtype != tensor.scalar_type()) {
        fail("{}: tensor {} is {}, the parameters before it are {}", file.path, entry.name,
             c10::toString(tensor.scalar_type()), c10::toString(*parameter_dtype));
      }
      parameter_dtype = tensor.scalar_type();
    }
    tensors.emplace_back(entry.name, tensor);
  }
  if (*parameter_dtype != at::kFloat && *parameter_dtype != at::kBFloat16) {
    fail("{}: parameters are {}, expected float32 or bfloat16", file.path,
         c10::toString(*parameter_dtype));
  }
  dtype = *parameter_dtype == at::kBFloat16 ? core::Dtype::kBf16 : core::Dtype::kFp32;
  return tensors;
}

// config.json of the export: the source's keys, then every key of the reference draft config
// written from the parsed model configuration.
json complete_config(const json& hf, const model::DSpineModelConfig& model, core::Dtype dtype,
                     const std::string& path) {
  model::HfConfigContext context;
  context.dtype = dtype;
  context.training_settings = training_settings(hf, path);
  const auto& ids = model.target_layer_ids;
  const json depth = hf.value("num_target_layers", json());
  context.num_target_layers = depth.is_number_integer()
                                  ? depth.get<int64_t>()
                                  : *std::max_element(ids.begin(), ids.end()) + 1;
  const json positions = hf.value("max_position_embeddings", json());
  if (positions.is_number_integer()) context.max_position_embeddings = positions.get<int64_t>();
  context.bos_token_id = hf.value("bos_token_id", json());  // the target's, recorded in training
  context.eos_token_id = hf.value("eos_token_id", json());
  json config = hf;
  config.update(model::dspine_hf_config(model, context), /*merge_objects=*/true);
  return config;
}

void write_json(const fs::path& path, const json& value) {
  std::ofstream out(path);
  out << value.dump(2) << "\n";
  out.close();
  if (!out) fail("cannot write {}: {}", path.string(), std::strerror(errno));
}

// kExportManifest: the size and SHA-256 of the files written in `dir`, which every later load
// (verify_weights) checks as it checks a checkpoint's.
void write_manifest(const fs::path& dir, const std::vector<std::string>& names) {
  json files = json::object();
  for (const std::string& name : names) {
    const auto digest = core::digest_file((dir / name).string());
    files[name] = {{"bytes", digest.bytes}, {"sha256", digest.sha256}};
  }
  write_json(dir / kExportManifest, {{"files", files}});
}

}  // namespace

ExportSummary export_draft(const std::string& source_dir, const std::string& out_dir) {
  std::error_code ec;
  if (fs::exists(fs::symlink_status(out_dir, ec))) {
    fail("{}: already exists; export never overwrites, choose a new directory", out_dir);
  }
  if (!fs::is_directory(source_dir)) {
    fail("{}: not a checkpoint directory (expected config.json and model.safetensors in it)",
         source_dir);
  }
  const fs::path source(source_dir);
  verify_weights(source_dir);  // the recorded sizes and SHA-256 of what is read below
  const std::string config_path = (source / "config.json").string();
  if (!fs::exists(config_path)) fail("{}: no such file; {} is not a draft checkpoint", config_path, source_dir);
  const json hf = model::read_json_file(config_path);
  const model::DSpineModelConfig model = model::model_config_from_hf(hf, config_path);

  const std::string weights_path = (source / "model.safetensors").string();
  if (!fs::exists(weights_path)) fail("{}: no such file; {} is not a draft checkpoint", weights_path, source_dir);
  const core::SafetensorsFile weights = core::load_safetensors(weights_path);
  ExportSummary summary;
  core::Dtype dtype;
  const core::NamedTensors tensors = reference_tensors(weights, model, dtype);
  const json config = complete_config(hf, model, dtype, config_path);

  const fs::path out(out_dir);
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  const fs::path temp = parent / fmt::format(".tmp-{}-{}", out.filename().string(), getpid());
  try {
    fs::create_directories(temp);
    core::save_safetensors((temp / "model.safetensors").string(), tensors, {{"format", "pt"}});
    write_json(temp / "config.json", config);
    write_manifest(temp, {"model.safetensors", "config.json"});
    // rename() would replace an empty directory created meanwhile.
    if (fs::exists(fs::symlink_status(out_dir, ec))) fail("{}: appeared during the export", out_dir);
    fs::rename(temp, out);
  } catch (const std::exception& e) {
    core::remove_tree(temp.string());
    if (dynamic_cast<const Error*>(&e)) throw;
    fail("cannot write {}: {}", out_dir, e.what());
  }
  summary.tensors = static_cast<int64_t>(tensors.size());
  summary.dtype = config["dtype"].get<std::string>();
  return summary;
}

}  // namespace dspine::train
