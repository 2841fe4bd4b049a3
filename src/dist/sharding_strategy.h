// What each distributed.sharding mode does, as the questions the sharding code asks
// (docs/distributed.md). The mode is turned into a strategy once; a new mode is one more row in
// sharding_strategy().
#pragma once

#include "core/config.h"

namespace dspine::dist {

struct ShardingStrategy {
  // Each rank owns slice `rank` of every unit's fp32 master, gradient and optimizer moments: a
  // unit's gradient is reduce-scattered and the stepped slices all-gathered. Otherwise every
  // rank owns all of them and gradients are all-reduced.
  bool shards_state;
  // A unit's model-dtype weights are resident only while the unit runs: gathered before its
  // forward and its backward, released after (the model announces its units).
  bool gathers_parameters_per_unit;
};

ShardingStrategy sharding_strategy(core::Sharding mode);

}  // namespace dspine::dist
