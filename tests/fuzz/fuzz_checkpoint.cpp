// Fuzz target: the text of a checkpoint's trainer_state.json manifest (docs/fuzzing.md).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    dspine::train::parse_trainer_state(std::string(reinterpret_cast<const char*>(data), size),
                                       "fuzz/trainer_state.json");
  } catch (const dspine::Error&) {  // a clean rejection; anything else escaping is a bug
  }
  return 0;
}
