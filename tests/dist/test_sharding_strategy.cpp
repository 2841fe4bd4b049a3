// What each distributed.sharding mode answers (dist/sharding_strategy.h); tests/mpi checks that
// the answers train as the modes did.
#include <gtest/gtest.h>

#include "dist/sharding_strategy.h"

namespace dspine::dist {
namespace {

TEST(ShardingStrategy, NoneKeepsEverythingOnEveryRank) {
  const ShardingStrategy none = sharding_strategy(core::Sharding::kNone);
  EXPECT_FALSE(none.shards_state);
  EXPECT_FALSE(none.gathers_parameters_per_unit);
}

TEST(ShardingStrategy, Zero2ShardsTheStateAndKeepsWeightsWhole) {
  const ShardingStrategy zero2 = sharding_strategy(core::Sharding::kZero2);
  EXPECT_TRUE(zero2.shards_state);
  EXPECT_FALSE(zero2.gathers_parameters_per_unit);
}

TEST(ShardingStrategy, Zero3AlsoGathersParametersPerUnit) {
  const ShardingStrategy zero3 = sharding_strategy(core::Sharding::kZero3);
  EXPECT_TRUE(zero3.shards_state);
  EXPECT_TRUE(zero3.gathers_parameters_per_unit);
}

}  // namespace
}  // namespace dspine::dist
