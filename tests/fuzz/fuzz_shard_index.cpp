// Fuzz target: the text of a shard directory's index.json (docs/fuzzing.md).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "data/shards.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    dspine::data::parse_shard_index(std::string(reinterpret_cast<const char*>(data), size),
                                    "fuzz/index.json");
  } catch (const dspine::Error&) {  // a clean rejection; anything else escaping is a bug
  }
  return 0;
}
