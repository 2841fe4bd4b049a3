// Placeholder until the collectives branch lands (taken from it at merge).
#include "dist/launch.h"

#include <torch/cuda.h>

#include "core/error.h"
#include "dist/mpi_context.h"

namespace dspine::dist {

RankLayout rank_layout() { return {}; }

c10::Device training_device(const std::string& choice, int local_rank) {
  const bool cuda = torch::cuda::is_available();
  if (choice == "cuda" && !cuda) fail("training.device = cuda, but no CUDA device is available");
  if (choice == "cpu" || (choice == "auto" && !cuda)) return c10::Device(c10::kCPU);
  return c10::Device(c10::kCUDA, static_cast<int8_t>(local_rank));
}

std::shared_ptr<Communicator> make_communicator(const core::DistributedConfig&, const c10::Device&) {
  return make_mpi_communicator();
}

}  // namespace dspine::dist
