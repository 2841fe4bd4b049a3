// A two-rank job in which rank 1 never joins rank 0's all-reduce: `killed` (rank 1 dies) or
// `stuck` (rank 1 sleeps), over MPI on the CPU or NCCL on GPU (local rank). Collectives time
// out after 5 s; the ctest entries and scripts/device_check_multi.sh check that the job ends
// non-zero well before rank 1's sleep would, naming the rank and the collective.
#include <csignal>
#include <cstdio>
#include <string>

#include <unistd.h>

#include <ATen/ATen.h>

#include "dist/launch.h"
#include "dist/mpi_context.h"
#include "dist/nccl_communicator.h"

int main(int argc, char** argv) {
  dspine::dist::MpiContext mpi(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  const std::string backend = argc > 2 ? argv[2] : "mpi";
  if ((mode != "killed" && mode != "stuck") || (backend != "mpi" && backend != "nccl")) {
    std::fprintf(stderr, "usage: hang_probe killed|stuck [mpi|nccl]\n");
    return 2;
  }
  constexpr double kTimeoutS = 5;
  const int local_rank = dspine::dist::rank_layout().local_rank;
  auto comm = backend == "mpi" ? dspine::dist::make_mpi_communicator(kTimeoutS)
                               : dspine::dist::make_nccl_communicator(local_rank, kTimeoutS);
  if (comm->rank() == 1) {
    if (mode == "killed") raise(SIGKILL);
    sleep(600);
    return 0;
  }
  auto tensor = at::ones({16}, backend == "mpi" ? at::Device(at::kCPU)
                                                : at::Device(at::kCUDA, local_rank));
  comm->all_reduce(tensor);
  comm->barrier();  // over NCCL the host waits here (all_reduce only queues the work)
  std::fprintf(stderr, "rank 0: all_reduce returned without rank 1\n");
  return 0;
}
