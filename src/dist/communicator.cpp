#include <ATen/ATen.h>

#include "dist/communicator.h"

namespace dspine::dist {

const char* collective_name(Collective kind) {
  switch (kind) {
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kAllGather: return "all_gather";
    case Collective::kReduceScatter: return "reduce_scatter";
  }
  return "collective";
}

namespace {

// The handle of a collective that finished before it was returned.
class FinishedCollective final : public PendingCollective {
 public:
  void wait() override {}
};

}  // namespace

std::unique_ptr<PendingCollective> Communicator::all_reduce_async(at::Tensor& tensor,
                                                                  ReduceOp op) {
  all_reduce(tensor, op);
  return std::make_unique<FinishedCollective>();
}

std::unique_ptr<PendingCollective> Communicator::all_gather_async(const at::Tensor& input,
                                                                  at::Tensor& output) {
  all_gather(input, output);
  return std::make_unique<FinishedCollective>();
}

std::unique_ptr<PendingCollective> Communicator::reduce_scatter_async(const at::Tensor& input,
                                                                      at::Tensor& output,
                                                                      ReduceOp op) {
  reduce_scatter(input, output, op);
  return std::make_unique<FinishedCollective>();
}

// The reduction (or gather) of one contribution is that contribution.
void SingleProcessCommunicator::all_reduce(at::Tensor& tensor, ReduceOp) {
  count_collective(Collective::kAllReduce, static_cast<int64_t>(tensor.nbytes()));
}

void SingleProcessCommunicator::broadcast(at::Tensor& tensor, int) {
  count_collective(Collective::kBroadcast, static_cast<int64_t>(tensor.nbytes()));
}

void SingleProcessCommunicator::all_gather(const at::Tensor& input, at::Tensor& output) {
  count_collective(Collective::kAllGather, static_cast<int64_t>(input.nbytes()));
  output.view(-1).copy_(input.reshape(-1));
}

void SingleProcessCommunicator::reduce_scatter(const at::Tensor& input, at::Tensor& output,
                                               ReduceOp) {
  count_collective(Collective::kReduceScatter, static_cast<int64_t>(input.nbytes()));
  output.view(-1).copy_(input.reshape(-1));
}

std::shared_ptr<Communicator> make_single_process_communicator() {
  return std::make_shared<SingleProcessCommunicator>();
}

}  // namespace dspine::dist
