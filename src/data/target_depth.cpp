#include "data/target_depth.h"

#include <algorithm>
#include <string>

#include <fmt/ranges.h>

#include "core/error.h"
#include "core/log.h"
#include "data/source_registry.h"

namespace dspine::data {

int64_t target_depth(const core::Config& config) {
  const auto& ids = config.model.target_layer_ids;
  const int64_t key = config.model.num_target_layers;
  const DataSourceEntry& source = data_source_entry(config.data.source);
  auto [depth, origin] = source.target_depth(config);
  if (key > 0 && depth > 0 && key != depth) {
    fail("model.num_target_layers = {} contradicts the target: {} gives {} layers", key, origin,
         depth);
  }
  if (key > 0) {
    depth = key;
    origin = "model.num_target_layers";
  }
  const int64_t least = least_target_depth(ids);
  if (depth == 0 && source.stands_in_for_any_target) return least;
  if (depth == 0) {
    log::warn(
        "data.source {} does not record the target's depth: config.json says "
        "num_target_layers {} (the least depth holding model.target_layer_ids); set "
        "model.num_target_layers to the target's num_hidden_layers",
        core::to_string(config.data.source), least);
    return least;
  }
  if (least > depth) {
    fail("model.target_layer_ids [{}] names layer {}, but the target has {} layers ({})",
         fmt::join(ids, ", "), least - 1, depth, origin);
  }
  return depth;
}

int64_t least_target_depth(const std::vector<int64_t>& target_layer_ids) {
  return target_layer_ids.empty()
             ? 1
             : *std::max_element(target_layer_ids.begin(), target_layer_ids.end()) + 1;
}

}  // namespace dspine::data
