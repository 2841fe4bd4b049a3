// Fuzz target: the bytes of a safetensors file through the reader (docs/fuzzing.md).
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "core/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    dspine::core::parse_safetensors(data, size, "fuzz.safetensors");
  } catch (const dspine::Error&) {  // a clean rejection; anything else escaping is a bug
  }
  return 0;
}
