// A two-rank job in which rank 1 never joins rank 0's all-reduce: `killed` (rank 1 dies) or
// `stuck` (rank 1 sleeps). Rank 0 runs with a 5 s collective timeout; the ctest entries check
// that the job ends non-zero well before rank 1's sleep would, naming the rank and collective.
#include <csignal>
#include <cstdio>
#include <string>

#include <unistd.h>

#include <ATen/ATen.h>

#include "dist/mpi_context.h"

int main(int argc, char** argv) {
  dspine::dist::MpiContext mpi(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "killed" && mode != "stuck") {
    std::fprintf(stderr, "usage: hang_probe killed|stuck\n");
    return 2;
  }
  auto comm = dspine::dist::make_mpi_communicator(/*timeout_s=*/5);
  if (comm->rank() == 1) {
    if (mode == "killed") raise(SIGKILL);
    sleep(600);
    return 0;
  }
  auto tensor = at::ones({16});
  comm->all_reduce(tensor);
  std::fprintf(stderr, "rank 0: all_reduce returned without rank 1\n");
  return 0;
}
