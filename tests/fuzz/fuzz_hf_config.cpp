// Fuzz target: a draft's Hugging Face config.json, read back and checked against a run's model
// (docs/fuzzing.md).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "model/hf_draft_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = "fuzz/config.json";
  try {
    const auto hf = dspine::model::parse_json_object(
        std::string(reinterpret_cast<const char*>(data), size), path);
    const auto model = dspine::model::model_config_from_hf(hf, path);
    dspine::model::check_hf_config(hf, model, path);  // a config always describes itself
  } catch (const dspine::Error&) {  // a clean rejection; anything else escaping is a bug
  }
  return 0;
}
