#include "dist/communicator.h"

namespace dspine::dist {
namespace {

// World of one: the reduction of one contribution is itself.
class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void all_reduce(at::Tensor&, ReduceOp) override { count_collective(); }
  void broadcast(at::Tensor&, int) override { count_collective(); }
  void all_gather(const at::Tensor& input, at::Tensor& output) override {
    count_collective();
    output.view(-1).copy_(input.reshape(-1));
  }
  void reduce_scatter(const at::Tensor& input, at::Tensor& output) override {
    count_collective();
    output.view(-1).copy_(input.reshape(-1));
  }
  void barrier() override {}
};

}  // namespace

std::shared_ptr<Communicator> make_single_process_communicator() {
  return std::make_shared<SingleProcessCommunicator>();
}

}  // namespace dspine::dist
