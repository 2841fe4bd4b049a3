#include <ATen/ATen.h>

#include "dist/communicator.h"

namespace dspine::dist {

// The reduction (or gather) of one contribution is that contribution.
void SingleProcessCommunicator::all_reduce(at::Tensor&, ReduceOp) { count_collective(); }

void SingleProcessCommunicator::broadcast(at::Tensor&, int) { count_collective(); }

void SingleProcessCommunicator::all_gather(const at::Tensor& input, at::Tensor& output) {
  count_collective();
  output.view(-1).copy_(input.reshape(-1));
}

void SingleProcessCommunicator::reduce_scatter(const at::Tensor& input, at::Tensor& output) {
  count_collective();
  output.view(-1).copy_(input.reshape(-1));
}

std::shared_ptr<Communicator> make_single_process_communicator() {
  return std::make_shared<SingleProcessCommunicator>();
}

}  // namespace dspine::dist
