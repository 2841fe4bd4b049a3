// Fuzz target: the bytes of one shard file, checked against a fixed index and served as a batch
// the way ShardReader::next serves it (docs/fuzzing.md).
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "core/safetensors.h"
#include "data/shards.h"

namespace {

// The index of the seed corpus's shard: 2 samples of 4 tokens, hidden size 3, 2 target layers.
const dspine::data::ShardIndex& index() {
  static const dspine::data::ShardIndex index = dspine::data::parse_shard_index(
      R"({"format": "dspine-shards", "version": 1, "seq_len": 4, "hidden_size": 3,
          "vocab_size": 16, "target_layer_ids": [0, 1], "dtype": "fp32", "num_samples": 2,
          "shards": [{"file": "shard-00000.safetensors", "first_sample": 0, "samples": 2}]})",
      "fuzz/index.json");
  return index;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const dspine::core::SafetensorsFile shard = dspine::data::check_shard(
        dspine::core::parse_safetensors(data, size, "fuzz/shard-00000.safetensors"), index(), 0);
    const dspine::data::DraftBatch batch{shard.at("input_ids"), shard.at("loss_mask"),
                                         shard.at("hidden_states"),
                                         shard.at("target_last_hidden_states")};
    batch.slice_rows(1, 2);
  } catch (const dspine::Error&) {  // a clean rejection; anything else escaping is a bug
  }
  return 0;
}
