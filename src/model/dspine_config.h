// DSpine draft configuration: the checks of dspine.md §2.2/§2.3 applied to the typed config, and
// the Hugging Face `config.json` of §2.1 that accompanies every checkpoint.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/config.h"

namespace dspine::model {

// Throws dspine::Error (every message contains "DSpine") when the draft sizes or dspine_config
// violate dspine.md §2.2/§2.3.
void validate_dspine_model_config(const core::ModelConfig& config);

// model.mask_token_id with -1 resolved to the last vocabulary id.
int64_t resolved_mask_token_id(const core::ModelConfig& config);

// The Qwen3Config-style config.json of dspine.md §2.1, with the complete dspine_config (§2.2):
// the model's keys plus `training_settings`, the objective's keys under their reference names
// (objectives::dspine_settings_json). `dtype` is training.dtype (fp32 | bf16).
nlohmann::json dspine_hf_config(const core::ModelConfig& config, const std::string& dtype,
                                const nlohmann::json& training_settings);

}  // namespace dspine::model
