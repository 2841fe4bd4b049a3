// The data sources, one entry each (data.source): how the source is made, its separate held-out
// set, and where it records the depth and the special token ids of the target its samples come
// from. Adding a source is its own files plus one entry in source_registry.cpp, with its
// enumerator and spelling in core/config.h (docs/ARCHITECTURE.md, "Extension points").
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/config.h"

namespace dspine::data {

class BatchSource;

// The depth of the target a source's samples come from, and where it is recorded (depth 0: the
// source does not record it).
struct RecordedDepth {
  int64_t depth = 0;
  std::string origin;
};

// The target's special token ids as its config.json writes them (an id or a list of ids), for
// the draft's config.json; null where the source records none.
struct TargetTokenIds {
  nlohmann::json bos_token_id, eos_token_id;
};

struct DataSourceEntry {
  core::DataSource source;
  // The training source of a configuration whose data.source this is (its keys checked by
  // core::validate); errors name the key or file.
  std::unique_ptr<BatchSource> (*make)(const core::Config& config, const c10::Device& device);
  // The key naming this source's separate held-out set, and the set (null when the key is
  // empty), read with the training source's target tables; "" / null for a source without one.
  const char* held_out_key;
  std::unique_ptr<BatchSource> (*make_held_out)(const core::Config& config, BatchSource& training);
  RecordedDepth (*target_depth)(const core::Config& config);
  TargetTokenIds (*target_token_ids)(const core::Config& config);
  // Random values stand in for any target (benchmarks): an unrecorded depth is no warning.
  bool stands_in_for_any_target;
};

// The entry of `source`.
const DataSourceEntry& data_source_entry(core::DataSource source);

}  // namespace dspine::data
