#include "core/device_generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>

namespace dspine::core {

at::Generator seeded_generator(const c10::Device& device, uint64_t seed) {
  at::Generator gen = device.is_cuda() ? at::detail::getCUDAHooks().getNewGenerator(device.index())
                                       : at::make_generator<at::CPUGeneratorImpl>();
  gen.set_current_seed(seed);
  return gen;
}

}  // namespace dspine::core
