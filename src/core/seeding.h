// Seed derivation shared by the data sources and the targets: every sample and every weight tensor
// gets its own generator, seeded from (data seed, index), so values never depend on how rows were
// grouped.
#pragma once

#include <cstdint>

namespace dspine::core {

// splitmix64's finalizer: spreads (seed, index) pairs over the generator's seed space so that
// neighbouring sample indices get unrelated random streams.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// The seed of sample `index` (or of any other stream numbered by `index`) under `seed`.
inline uint64_t stream_seed(int64_t seed, int64_t index) {
  return splitmix64(static_cast<uint64_t>(seed)) ^ static_cast<uint64_t>(index);
}

// at::mt19937 keeps 32 bits of its seed: fold the high half in so every bit counts.
inline uint64_t generator_seed(uint64_t seed) {
  const uint64_t mixed = splitmix64(seed);
  return (mixed ^ (mixed >> 32)) & 0xFFFFFFFFULL;
}

}  // namespace dspine::core
