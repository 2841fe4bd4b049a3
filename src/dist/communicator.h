// One collective interface, two back ends: MPI (CPU tensors; CI and tests) and NCCL (CUDA
// tensors on a dedicated stream). A world of one process is a valid communicator whose
// collectives are no-ops, so single-process code paths are the distributed ones.
#pragma once

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

namespace dspine::dist {

enum class ReduceOp { kSum, kMax };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // In-place all-reduce of a contiguous tensor.
  virtual void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum) = 0;
  // In-place broadcast of `tensor` from `root` to every rank.
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  // output (world_size × input.numel() elements) = concatenation of every rank's input.
  virtual void all_gather(const at::Tensor& input, at::Tensor& output) = 0;
  // output (input.numel() / world_size elements) = rank's slice of the element-wise sum.
  virtual void reduce_scatter(const at::Tensor& input, at::Tensor& output) = 0;
  virtual void barrier() = 0;

  // Collectives issued so far (tests check, e.g., that a window reduces its CE scale once).
  int64_t collective_count() const { return collective_count_; }

 protected:
  void count_collective() { ++collective_count_; }

 private:
  int64_t collective_count_ = 0;
};

// World of one: every collective is the identity (and is still counted, so tests can check how
// many a piece of code issues).
class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void all_reduce(at::Tensor& tensor, ReduceOp op) override;
  void broadcast(at::Tensor& tensor, int root) override;
  void all_gather(const at::Tensor& input, at::Tensor& output) override;
  void reduce_scatter(const at::Tensor& input, at::Tensor& output) override;
  void barrier() override {}
};

std::shared_ptr<Communicator> make_single_process_communicator();

}  // namespace dspine::dist
