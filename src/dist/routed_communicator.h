// A GPU run reduces two kinds of tensors: CUDA gradients and weights, and small host-side sums
// (loss normalizers, metrics, RNG states). This communicator sends each where it belongs: CUDA
// tensors to the NCCL communicator, CPU tensors and barriers to the MPI one.
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace dspine::dist {

std::shared_ptr<Communicator> make_routed_communicator(std::shared_ptr<Communicator> cuda,
                                                       std::shared_ptr<Communicator> cpu);

}  // namespace dspine::dist
