// A random generator of a given device (CUDA or CPU), seeded: where sampled values must not depend
// on the global generators or on anything else drawn in the run.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <cstdint>

namespace dspine::core {

at::Generator seeded_generator(const c10::Device& device, uint64_t seed);

}  // namespace dspine::core
