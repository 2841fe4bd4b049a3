// One collective interface, three back ends: MPI (CPU tensors; CI and tests), NCCL (CUDA tensors
// on a dedicated stream) and a world of one process whose collectives are the identity, so
// single-process code paths are the distributed ones. docs/distributed.md describes the launch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

namespace dspine::dist {

enum class ReduceOp { kSum, kAvg, kMax };

// The collectives counted per kind (benchmarks report the bytes each moves per rank).
enum class Collective { kAllReduce, kBroadcast, kAllGather, kReduceScatter };
inline constexpr int kCollectiveKinds = 4;
const char* collective_name(Collective kind);  // "all_reduce", ...

// A collective that was started and may still be running. wait() makes its result visible to
// the caller: on the CPU it returns when the data is there; over NCCL it makes the caller's
// current CUDA stream wait for the communication stream (no host synchronisation).
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend() const = 0;  // "single", "mpi" or "nccl"
  // Whether all_reduce takes tensors on the GPU (NCCL, and a world of one), so that a caller
  // can reduce a value where it was computed instead of reading it to the host first.
  virtual bool reduces_device_tensors() const = 0;

  // In-place all-reduce of a contiguous tensor.
  virtual void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum) = 0;
  // In-place broadcast of `tensor` from `root` to every rank.
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  // output (world_size × input.numel() elements) = concatenation of every rank's input.
  virtual void all_gather(const at::Tensor& input, at::Tensor& output) = 0;
  // output (input.numel() / world_size elements) = rank's slice of the element-wise reduction.
  virtual void reduce_scatter(const at::Tensor& input, at::Tensor& output,
                              ReduceOp op = ReduceOp::kSum) = 0;
  virtual void barrier() = 0;

  // Asynchronous forms: start now, wait() later. The communicator keeps the tensors it was
  // given alive until the collective is done; the caller must not touch them before wait().
  // The default runs the collective at once and returns a finished handle.
  virtual std::unique_ptr<PendingCollective> all_reduce_async(at::Tensor& tensor,
                                                              ReduceOp op = ReduceOp::kSum);
  virtual std::unique_ptr<PendingCollective> all_gather_async(const at::Tensor& input,
                                                              at::Tensor& output);
  virtual std::unique_ptr<PendingCollective> reduce_scatter_async(const at::Tensor& input,
                                                                  at::Tensor& output,
                                                                  ReduceOp op = ReduceOp::kSum);

  // Collectives issued so far (tests check, e.g., that a window reduces its CE scale once).
  int64_t collective_count() const { return collective_count_; }
  int64_t collective_count(Collective kind) const { return count_of_[static_cast<int>(kind)]; }
  // Payload bytes this rank handed to collectives so far (input of all-reduce, all-gather and
  // reduce-scatter; broadcast counts its tensor): what benchmarks report per rank.
  int64_t bytes_moved() const { return bytes_moved_; }
  int64_t bytes_moved(Collective kind) const { return bytes_of_[static_cast<int>(kind)]; }

 protected:
  void count_collective(Collective kind, int64_t bytes) {
    ++collective_count_;
    bytes_moved_ += bytes;
    ++count_of_[static_cast<int>(kind)];
    bytes_of_[static_cast<int>(kind)] += bytes;
  }

 private:
  int64_t collective_count_ = 0;
  int64_t bytes_moved_ = 0;
  int64_t count_of_[kCollectiveKinds] = {};
  int64_t bytes_of_[kCollectiveKinds] = {};
};

// World of one: every collective is the identity (and is still counted, so tests can check how
// many a piece of code issues).
class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "single"; }
  bool reduces_device_tensors() const override { return true; }
  void all_reduce(at::Tensor& tensor, ReduceOp op) override;
  void broadcast(at::Tensor& tensor, int root) override;
  void all_gather(const at::Tensor& input, at::Tensor& output) override;
  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override;
  void barrier() override {}
};

std::shared_ptr<Communicator> make_single_process_communicator();

}  // namespace dspine::dist
