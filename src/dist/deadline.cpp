#include "dist/deadline.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

namespace dspine::dist {

void report_failure(int rank, const std::string& message) {
  std::fprintf(stderr, "error (rank %d): %s\n", rank, message.c_str());
  std::fflush(stderr);
}

void end_job(int code) {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void abort_job(int rank, const std::string& message) {
  report_failure(rank, message);
  end_job(1);
}

}  // namespace dspine::dist
