#include "dist/launch.h"

#include <mpi.h>

#include <cstdlib>
#include <string>

#include <c10/cuda/CUDAFunctions.h>

#include "core/error.h"
#include "dist/mpi_context.h"
#include "dist/nccl_communicator.h"
#include "dist/routed_communicator.h"

namespace dspine::dist {
namespace {

// The first of `names` that is set, as an int; `fallback` when none is.
int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* name : names) {
    const char* text = std::getenv(name);
    if (text == nullptr) continue;
    char* end = nullptr;
    const long value = std::strtol(text, &end, 10);
    if (end == text || *end != '\0' || value < 0)
      fail("environment variable {}='{}' is not a non-negative integer", name, text);
    return static_cast<int>(value);
  }
  return fallback;
}

RankLayout mpi_layout() {
  RankLayout layout;
  MPI_Comm_rank(MPI_COMM_WORLD, &layout.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &layout.world_size);
  MPI_Comm host;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, layout.rank, MPI_INFO_NULL, &host);
  MPI_Comm_rank(host, &layout.local_rank);
  MPI_Comm_size(host, &layout.local_world_size);
  MPI_Comm_free(&host);
  return layout;
}

// torchrun's variables, then OpenMPI's (a process started by mpirun before MPI_Init).
RankLayout environment_layout() {
  RankLayout layout;
  layout.rank = env_int({"RANK", "OMPI_COMM_WORLD_RANK"}, 0);
  layout.world_size = env_int({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"}, 1);
  layout.local_rank = env_int({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"}, 0);
  layout.local_world_size = env_int({"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}, 1);
  if (layout.rank >= layout.world_size || layout.local_rank >= layout.local_world_size) {
    fail("launcher environment: rank {} of {} (local {} of {}) is out of range", layout.rank,
         layout.world_size, layout.local_rank, layout.local_world_size);
  }
  return layout;
}

}  // namespace

RankLayout rank_layout() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return environment_layout();
  // The split is collective: done once (MpiContext does it on every rank at start-up), so any
  // rank may ask later on its own.
  static const RankLayout layout = mpi_layout();
  return layout;
}

c10::Device training_device(core::Device choice, int local_rank) {
  if (choice == core::Device::kCpu) return c10::Device(c10::kCPU);
  const int devices = c10::cuda::device_count();
  if (devices == 0) {
    if (choice == core::Device::kAuto) return c10::Device(c10::kCPU);
    fail("training.device = cuda, but no CUDA device is available");
  }
  if (local_rank >= devices) {
    fail(
        "training.device = {}: local rank {} needs GPU {}, but this host has {} (start at "
        "most {} ranks per host)",
        core::to_string(choice), local_rank, local_rank, devices, devices);
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

std::shared_ptr<Communicator> make_communicator(const core::DistributedConfig& config,
                                                const c10::Device& device) {
  const RankLayout layout = rank_layout();
  if (layout.world_size == 1) return make_single_process_communicator();
  using core::CommBackend;
  CommBackend backend = config.backend;
  if (backend == CommBackend::kAuto) {
    backend = device.is_cuda() ? CommBackend::kNccl : CommBackend::kMpi;
  }
  if (backend == CommBackend::kNccl) {
    if (!device.is_cuda()) {
      fail("distributed.backend = nccl needs a CUDA training device, but it is {}; set "
           "training.device = cuda, or distributed.backend = auto or mpi",
           device.str());
    }
    // Host-side sums (normalizers, metrics, RNG states) stay on the CPU and go over MPI.
    return make_routed_communicator(
        make_nccl_communicator(device.has_index() ? device.index() : layout.local_rank,
                               config.timeout_s),
        make_mpi_communicator(config.timeout_s));
  }
  if (device.is_cuda()) {
    fail("distributed.backend = mpi needs CPU tensors, but the training device is {}; set "
         "distributed.backend = nccl or auto",
         device.str());
  }
  return make_mpi_communicator(config.timeout_s);
}

}  // namespace dspine::dist
