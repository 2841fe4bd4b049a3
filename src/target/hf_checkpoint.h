// Reading a Hugging Face checkpoint directory: its config.json (read_qwen3_config, declared in
// qwen3_model.h) and its weights, from one model.safetensors or from the shards listed by
// model.safetensors.index.json.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "target/qwen3_model.h"

namespace dspine::target {

// Every tensor of the directory's weights, on the CPU in the stored dtype, each with its file.
// A sharded index must list each tensor in exactly the file that holds it; what does not match
// throws dspine::Error naming the index, the file and the tensor.
Qwen3Weights read_hf_weights(const std::string& dir);

// The file of the directory that holds `tensor`: the one the sharded index lists it in ("" when
// the index lists it nowhere), else model.safetensors. Reads no weights.
std::string hf_file_holding(const std::string& dir, const std::string& tensor);

// A config.json as a JSON object, read as read_qwen3_config reads it (errors name the file).
nlohmann::json read_hf_config_json(const std::string& config_json_path);

}  // namespace dspine::target
