// Reading a DSpine draft's Hugging Face config.json back (docs/model.md#configjson): the model
// configuration it describes, and its check against the model a run builds, so that a draft
// trained elsewhere, or exported here, loads only into a draft of the same shape.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "model/dspine_config.h"

namespace dspine::model {

// The JSON object in the file at `path`, or in `text` read from it; errors name the file.
nlohmann::json read_json_file(const std::string& path);
nlohmann::json parse_json_object(const std::string& text, const std::string& path);

// The model section `hf` describes (architecture dspine). block_size may instead sit in
// dflash_config; absent model keys of dspine_config take their defaults; layer_types must list
// every layer; rope_theta may sit at the top level, in rope_parameters or in rope_scaling, and
// must agree where it sits in several. Rejects what the draft does not implement (another
// architecture, is_causal false, attention biases, sliding layers, a RoPE type other than
// "default"), integers past 2^31 - 1 and sizes that fail validate_dspine_model_config; errors
// name `path` and the key.
DSpineModelConfig model_config_from_hf(const nlohmann::json& hf, const std::string& path);

// Throws naming `path` and, for every key whose value differs, the key, the saved value and the
// run's, when `hf` describes another draft than `run` (sizes, heads, vocabulary, block size,
// mask token, target layers, RoPE and norm constants, dspine_config's model keys). Training-only
// keys (the objective's dspine_config keys, dtype, initializer_range) may differ.
void check_hf_config(const nlohmann::json& hf, const DSpineModelConfig& run,
                     const std::string& path);

}  // namespace dspine::model
