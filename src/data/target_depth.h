// The depth of the target model the draft reads, as a draft's config.json records it
// (num_target_layers; docs/model.md, "config.json").
#pragma once

#include <cstdint>
#include <vector>

#include "core/config.h"

namespace dspine::data {

// model.num_target_layers when set, else the data source's target: num_hidden_layers of
// data.target.path/config.json (sources target and specforge) or data.synthetic.num_layers
// (synthetic). Shards do not record their target's depth, and random values stand for any
// target: without the key, the least depth holding every target layer id (with a warning for
// shards). A set key that contradicts the target, or
// a target layer id at or past the depth, is an error naming both.
int64_t target_depth(const core::Config& config);

// The least depth holding every target layer id (1 for none): the depth recorded where the
// target's own is not known.
int64_t least_target_depth(const std::vector<int64_t>& target_layer_ids);

}  // namespace dspine::data
