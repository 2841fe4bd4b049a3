// DSpine draft configuration: its own settings (the map model.dspine, read by the draft registry's
// dspine entry), the checks of docs/model.md ("config.json") applied to the typed config, and the
// Hugging Face `config.json` that accompanies every checkpoint.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/config.h"

namespace dspine::model {

// docs/model.md ("config.json"): the DSpine draft's architecture / inference hyper-parameters, the
// map model.dspine (the reference's dspine_config, same names/defaults). Its training settings are
// objective.dspine (objectives/dspine_settings.h).
struct DSpineConfig {
  int64_t transfer_rank = 1024;
  int64_t message_size = 512;
  int64_t top_k = 16;
  int64_t replacement_layers = 3;
};

// A DSpine draft's whole configuration: the model section's shared keys and model.dspine.
struct DSpineModelConfig : core::ModelConfig {
  DSpineConfig dspine;
};

// The declaration of the map model.dspine (core/settings.h), with the reference's rules in its
// words: every range message contains "DSpine" and the rule. The bounds that involve hidden_size /
// vocab_size apply when `run`'s model.architecture is dspine.
core::Settings settings_of(DSpineConfig& dspine, const core::Config& run);

// Throws dspine::Error (every message contains "DSpine") when the draft sizes or dspine_config
// violate docs/model.md ("config.json").
void validate_dspine_model_config(const DSpineModelConfig& config);

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
  // The target's special token ids as its config.json writes them (an id or a list of ids);
  // null where the run has no such record (the synthetic target has none).
  nlohmann::json bos_token_id, eos_token_id;
};

// The Qwen3Config-style config.json of the draft (docs/model.md#configjson): every key of the
// reference draft config, with the complete dspine_config.
nlohmann::json dspine_hf_config(const DSpineModelConfig& config, const HfConfigContext& context);

}  // namespace dspine::model
