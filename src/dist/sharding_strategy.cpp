#include "dist/sharding_strategy.h"

#include "core/error.h"

namespace dspine::dist {

ShardingStrategy sharding_strategy(core::Sharding mode) {
  switch (mode) {
    case core::Sharding::kNone:
      return {/*shards_state=*/false, /*gathers_parameters_per_unit=*/false};
    case core::Sharding::kZero2:
      return {/*shards_state=*/true, /*gathers_parameters_per_unit=*/false};
    case core::Sharding::kZero3:
      return {/*shards_state=*/true, /*gathers_parameters_per_unit=*/true};
  }
  fail("distributed.sharding: unknown mode {}", core::to_string(mode));
}

}  // namespace dspine::dist
