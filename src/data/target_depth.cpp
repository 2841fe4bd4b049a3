#include "data/target_depth.h"

#include <algorithm>
#include <filesystem>
#include <string>

#include <fmt/ranges.h>

#include "core/error.h"
#include "core/log.h"
#include "data/qwen3_model.h"

namespace dspine::data {

int64_t target_depth(const core::Config& config) {
  const auto& ids = config.model.target_layer_ids;
  const int64_t key = config.model.num_target_layers;
  using core::DataSource;
  const DataSource source = config.data.source;
  int64_t depth = 0;
  std::string origin;
  if (source == DataSource::kTarget || source == DataSource::kSpecforge) {
    origin = (std::filesystem::path(config.data.target.path) / "config.json").string();
    depth = read_qwen3_config(origin).num_hidden_layers;
  } else if (source == DataSource::kSynthetic) {
    origin = "data.synthetic.num_layers";
    depth = config.data.synthetic.num_layers;
  }
  if (key > 0 && depth > 0 && key != depth) {
    fail("model.num_target_layers = {} contradicts the target: {} gives {} layers", key, origin,
         depth);
  }
  if (key > 0) {
    depth = key;
    origin = "model.num_target_layers";
  }
  const int64_t least = ids.empty() ? 1 : *std::max_element(ids.begin(), ids.end()) + 1;
  // Random values stand in for any target (benchmarks): nothing to warn about.
  if (depth == 0 && source == DataSource::kRandom) return least;
  if (depth == 0) {
    log::warn(
        "data.source {} does not record the target's depth: config.json says "
        "num_target_layers {} (the least depth holding model.target_layer_ids); set "
        "model.num_target_layers to the target's num_hidden_layers",
        core::to_string(source), least);
    return least;
  }
  if (least > depth) {
    fail("model.target_layer_ids [{}] names layer {}, but the target has {} layers ({})",
         fmt::join(ids, ", "), least - 1, depth, origin);
  }
  return depth;
}

}  // namespace dspine::data
