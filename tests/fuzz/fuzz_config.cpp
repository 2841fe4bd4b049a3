// Fuzz target: YAML config text through the config loader (docs/fuzzing.md).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/config.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    dspine::core::parse_config(std::string(reinterpret_cast<const char*>(data), size), "fuzz", {});
  } catch (const dspine::Error&) {  // a clean rejection; anything else escaping is a bug
  }
  return 0;
}
