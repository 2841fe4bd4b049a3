#include "dist/routed_communicator.h"

#include <ATen/core/Tensor.h>

namespace dspine::dist {
namespace {

class RoutedCommunicator final : public Communicator {
 public:
  RoutedCommunicator(std::shared_ptr<Communicator> cuda, std::shared_ptr<Communicator> cpu)
      : cuda_(std::move(cuda)), cpu_(std::move(cpu)) {}
  int rank() const override { return cpu_->rank(); }
  int world_size() const override { return cpu_->world_size(); }
  std::string backend() const override { return cuda_->backend() + "+" + cpu_->backend(); }
  bool reduces_device_tensors() const override { return cuda_->reduces_device_tensors(); }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    all_reduce_async(tensor, op)->wait();
  }
  void broadcast(at::Tensor& tensor, int root) override {
    count_collective(Collective::kBroadcast, static_cast<int64_t>(tensor.nbytes()));
    for_tensor(tensor).broadcast(tensor, root);
  }
  void all_gather(const at::Tensor& input, at::Tensor& output) override {
    all_gather_async(input, output)->wait();
  }
  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override {
    reduce_scatter_async(input, output, op)->wait();
  }
  void barrier() override { cpu_->barrier(); }

  std::unique_ptr<PendingCollective> all_reduce_async(at::Tensor& tensor, ReduceOp op) override {
    count_collective(Collective::kAllReduce, static_cast<int64_t>(tensor.nbytes()));
    return for_tensor(tensor).all_reduce_async(tensor, op);
  }
  std::unique_ptr<PendingCollective> all_gather_async(const at::Tensor& input,
                                                      at::Tensor& output) override {
    count_collective(Collective::kAllGather, static_cast<int64_t>(input.nbytes()));
    return for_tensor(input).all_gather_async(input, output);
  }
  std::unique_ptr<PendingCollective> reduce_scatter_async(const at::Tensor& input,
                                                          at::Tensor& output,
                                                          ReduceOp op) override {
    count_collective(Collective::kReduceScatter, static_cast<int64_t>(input.nbytes()));
    return for_tensor(input).reduce_scatter_async(input, output, op);
  }

 private:
  Communicator& for_tensor(const at::Tensor& tensor) {
    return tensor.is_cuda() ? *cuda_ : *cpu_;
  }
  std::shared_ptr<Communicator> cuda_, cpu_;
};

}  // namespace

std::shared_ptr<Communicator> make_routed_communicator(std::shared_ptr<Communicator> cuda,
                                                       std::shared_ptr<Communicator> cpu) {
  return std::make_shared<RoutedCommunicator>(std::move(cuda), std::move(cpu));
}

}  // namespace dspine::dist
