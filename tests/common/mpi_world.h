// What the mpirun-launched tests (tests/mpi, the *_np2 ctests) share: the run's communicator and
// one scratch directory that every rank agrees on.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include <torch/torch.h>

#include "core/config.h"
#include "core/files.h"
#include "dist/launch.h"

namespace dspine::testing {

// The communicator of this mpirun on `device` (MPI on the CPU; NCCL plus MPI for host sums on
// GPUs), its collectives bounded by `timeout_s` so that a hung rank fails the test.
inline std::shared_ptr<dist::Communicator> mpi_world(double timeout_s,
                                                     const torch::Device& device = torch::kCPU) {
  core::DistributedConfig distributed;
  distributed.timeout_s = timeout_s;
  return dist::make_communicator(distributed, device);
}

// One directory name on every rank (rank 0's pid), unique per run; rank 0 empties it before any
// rank goes on.
inline std::filesystem::path shared_dir(dist::Communicator& comm, const std::string& name) {
  auto stamp = torch::tensor({static_cast<int64_t>(::getpid())}, torch::kLong);
  comm.broadcast(stamp, 0);
  const auto dir = std::filesystem::temp_directory_path() /
                   ("dspine_mpi_" + name + "_" + std::to_string(stamp.item<int64_t>()));
  if (comm.rank() == 0) core::remove_tree(dir.string());
  comm.barrier();
  return dir;
}

}  // namespace dspine::testing
