// Collectives over NCCL on CUDA tensors. Each collective runs on the communicator's own
// high-priority stream after the work already queued on the caller's current stream; its result
// is visible to the caller's stream after the sync form returns or the handle's wait() (no host
// synchronisation except in barrier()). A watchdog thread ends every rank when a collective
// does not finish within the timeout.
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace dspine::dist {

// One NCCL communicator over all MPI ranks on CUDA device `device` (this rank's GPU). Needs MPI
// initialised: rank 0 creates the NCCL id and broadcasts it over MPI_COMM_WORLD.
std::shared_ptr<Communicator> make_nccl_communicator(int device, double timeout_s);

}  // namespace dspine::dist
