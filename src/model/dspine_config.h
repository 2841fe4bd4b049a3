// DSpine draft configuration: the checks of docs/model.md ("config.json") applied to the typed
// config, and the Hugging Face `config.json` of §2.1 that accompanies every checkpoint.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/config.h"

namespace dspine::model {

// Throws dspine::Error (every message contains "DSpine") when the draft sizes or dspine_config
// violate docs/model.md ("config.json").
void validate_dspine_model_config(const core::ModelConfig& config);

// model.mask_token_id with -1 resolved to the last vocabulary id.
int64_t resolved_mask_token_id(const core::ModelConfig& config);

// What config.json records beyond the draft's own sizes (informational for loaders).
struct HfConfigContext {
  core::Dtype dtype = core::Dtype::kFp32;  // the dtype of the saved parameters
  // The objective's dspine_config keys under their reference names
  // (objectives::dspine_settings_json); they join the model's four.
  nlohmann::json training_settings = nlohmann::json::object();
  int64_t num_target_layers = 0;        // depth of the target the hidden states come from
  int64_t max_position_embeddings = 0;  // the longest sequence trained on; 0: unknown, left out
};

// The context of a training run: training.dtype, data.seq_len, and the target depth
// (model.num_target_layers, which the trainer resolves from the data source; unresolved, the least
// depth holding every target layer id).
HfConfigContext hf_config_context(const core::Config& run, const nlohmann::json& training_settings);

// The Qwen3Config-style config.json of the draft (docs/model.md#configjson): every key of the
// reference draft config, with the complete dspine_config.
nlohmann::json dspine_hf_config(const core::ModelConfig& config, const HfConfigContext& context);
nlohmann::json dspine_hf_config(const core::Config& run, const nlohmann::json& training_settings);

}  // namespace dspine::model
