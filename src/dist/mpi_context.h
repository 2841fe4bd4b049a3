// MPI bootstraps every run (mpirun -np N, or a plain single process as a singleton).
#pragma once

#include <exception>
#include <memory>

#include "dist/communicator.h"

namespace dspine::dist {

// RAII MPI_Init / MPI_Finalize; safe to construct when MPI is already initialised (tests).
class MpiContext {
 public:
  MpiContext(int* argc, char*** argv);
  ~MpiContext();
  MpiContext(const MpiContext&) = delete;
  MpiContext& operator=(const MpiContext&) = delete;
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // Ends every rank (a failing rank must not leave the others blocked in a collective).
  [[noreturn]] void abort(int code) const;
  // What an app's main does with an exception: one line on stderr ("error" for a dspine::Error,
  // which carries its context, "internal error" otherwise; the rank when there are several),
  // then exit status 1 in a world of one, or every rank ended.
  int fail_run(const std::exception& error) const;

 private:
  bool owns_ = false;
  int rank_ = 0;
  int world_size_ = 1;
};

// Collectives over MPI_COMM_WORLD on CPU tensors (the CPU back end used by CI and tests). A
// collective not finished after `timeout_s` seconds ends every rank (distributed.timeout_s).
std::shared_ptr<Communicator> make_mpi_communicator(double timeout_s);

}  // namespace dspine::dist
