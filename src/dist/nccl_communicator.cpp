#include "dist/nccl_communicator.h"

#include <mpi.h>
#include <nccl.h>

#include <initializer_list>

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "core/error.h"
#include "dist/collective_checks.h"
#include "dist/deadline.h"
#include "dist/mpi_context.h"
#include "dist/nccl_watchdog.h"

namespace dspine::dist {
namespace {

constexpr const char* kBackend = "NCCL";

ncclDataType_t nccl_type(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kBFloat16: return ncclBfloat16;
    case at::kFloat: return ncclFloat32;
    case at::kHalf: return ncclFloat16;
    case at::kDouble: return ncclFloat64;
    case at::kLong: return ncclInt64;
    case at::kInt: return ncclInt32;
    case at::kByte: return ncclUint8;
    default: fail("NCCL communicator: unsupported dtype {}", c10::toString(tensor.scalar_type()));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
  }
  fail("NCCL communicator: unknown ReduceOp {}", static_cast<int>(op));
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail("NCCL {}: CUDA error: {}", what, cudaGetErrorString(status));
}

// A collective queued on the communication stream: waiting makes the caller's current stream
// wait for its completion event.
class NcclPending final : public PendingCollective {
 public:
  NcclPending(CompletionEvent done, int device) : done_(std::move(done)), device_(device) {}
  void wait() override {
    check_cuda(cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream(device_).stream(),
                                   done_.get(), 0),
               "wait");
  }

 private:
  CompletionEvent done_;
  int device_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int device, double timeout_s, int rank, int world_size, ncclUniqueId id)
      : device_(device),
        rank_(rank),
        world_size_(world_size),
        timeout_s_(timeout_s),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true,
                                             static_cast<c10::DeviceIndex>(device))) {
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    ready_ = make_completion_event();
    // Non-blocking initialisation, so that a rank that never joins cannot hang this one.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check_nccl(ncclCommInitRankConfig(&comm_, world_size, id, rank, &config), "init");
    watchdog_ = std::make_unique<NcclWatchdog>(comm_, device, rank, timeout_s);
  }

  ~NcclCommunicator() override {
    watchdog_.reset();
    ncclResult_t result = ncclCommFinalize(comm_);
    const bool clean = settle(result) && result == ncclSuccess;
    if (clean) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "nccl"; }
  bool reduces_device_tensors() const override { return true; }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    all_reduce_async(tensor, op)->wait();
  }
  void broadcast(at::Tensor& tensor, int root) override {
    require_on_device(tensor, "broadcast");
    count_collective(Collective::kBroadcast, static_cast<int64_t>(tensor.nbytes()));
    launch("broadcast", {&tensor}, [&](cudaStream_t stream) {
      return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                           nccl_type(tensor), root, comm_, stream);
    })->wait();
  }
  void all_gather(const at::Tensor& input, at::Tensor& output) override {
    all_gather_async(input, output)->wait();
  }
  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override {
    reduce_scatter_async(input, output, op)->wait();
  }
  // The host waits here (a one-element all-reduce, then the communication stream); the
  // watchdog ends the job if that never finishes.
  void barrier() override {
    if (!barrier_token_.defined()) {
      barrier_token_ = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(
                                          c10::kCUDA, static_cast<c10::DeviceIndex>(device_)));
    }
    launch("barrier", {&barrier_token_}, [&](cudaStream_t stream) {
      return ncclAllReduce(barrier_token_.data_ptr(), barrier_token_.data_ptr(), 1, ncclFloat32,
                           ncclSum, comm_, stream);
    });
    check_cuda(cudaStreamSynchronize(stream_.stream()), "barrier");
  }

  std::unique_ptr<PendingCollective> all_reduce_async(at::Tensor& tensor, ReduceOp op) override {
    require_on_device(tensor, "all_reduce");
    check_reduce_op(tensor, op, kBackend, "all_reduce");
    count_collective(Collective::kAllReduce, static_cast<int64_t>(tensor.nbytes()));
    return launch("all_reduce", {&tensor}, [&](cudaStream_t stream) {
      return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                           nccl_type(tensor), nccl_op(op), comm_, stream);
    });
  }

  std::unique_ptr<PendingCollective> all_gather_async(const at::Tensor& input,
                                                      at::Tensor& output) override {
    require_on_device(input, "all_gather");
    require_on_device(output, "all_gather");
    check_gather_sizes(input, output, world_size_, kBackend);
    count_collective(Collective::kAllGather, static_cast<int64_t>(input.nbytes()));
    // Gathered as bytes: every dtype, and output may have a different dtype than input.
    return launch("all_gather", {&input, &output}, [&](cudaStream_t stream) {
      return ncclAllGather(input.data_ptr(), output.data_ptr(), input.nbytes(), ncclUint8,
                           comm_, stream);
    });
  }

  std::unique_ptr<PendingCollective> reduce_scatter_async(const at::Tensor& input,
                                                          at::Tensor& output,
                                                          ReduceOp op) override {
    require_on_device(input, "reduce_scatter");
    require_on_device(output, "reduce_scatter");
    check_scatter_sizes(input, output, world_size_, kBackend);
    check_reduce_op(input, op, kBackend, "reduce_scatter");
    count_collective(Collective::kReduceScatter, static_cast<int64_t>(input.nbytes()));
    return launch("reduce_scatter", {&input, &output}, [&](cudaStream_t stream) {
      return ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(),
                               nccl_type(input), nccl_op(op), comm_, stream);
    });
  }

 private:
  void require_on_device(const at::Tensor& tensor, const char* what) const {
    require_contiguous_on(tensor,
                          c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_)),
                          kBackend, what);
  }

  // A non-blocking communicator answers ncclInProgress while a call is still being set up:
  // poll until it settles. False when it has not settled within the timeout.
  bool settle(ncclResult_t& result) const {
    if (result != ncclInProgress) return true;
    return poll_until(
        [&] {
          ncclCommGetAsyncError(comm_, &result);
          return result != ncclInProgress;
        },
        timeout_s_);
  }

  void check_nccl(ncclResult_t result, const char* what) const {
    if (!settle(result)) {
      abort_nccl(comm_, rank_,
                 fmt::format("NCCL {} did not finish within {} s (another rank failed or "
                             "stopped)",
                             what, timeout_s_));
    }
    if (result != ncclSuccess) {
      fail("NCCL {} failed on rank {}: {} ({})", what, rank_, ncclGetErrorString(result),
           ncclGetLastError(comm_));
    }
  }

  // Queues `issue` on the communication stream after the caller's queued work; records the
  // tensors' use there so the caching allocator does not hand their memory out again before
  // the collective is done, even if the caller frees them at once.
  template <typename Issue>
  std::unique_ptr<PendingCollective> launch(const char* what,
                                            std::initializer_list<const at::Tensor*> tensors,
                                            Issue&& issue) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    const cudaStream_t caller = c10::cuda::getCurrentCUDAStream(device_).stream();
    check_cuda(cudaEventRecord(ready_.get(), caller), what);
    check_cuda(cudaStreamWaitEvent(stream_.stream(), ready_.get(), 0), what);
    check_nccl(issue(stream_.stream()), what);
    for (const at::Tensor* tensor : tensors) {
      c10::cuda::CUDACachingAllocator::recordStream(tensor->storage().data_ptr(), stream_);
    }
    CompletionEvent done = make_completion_event();
    check_cuda(cudaEventRecord(done.get(), stream_.stream()), what);
    watchdog_->watch(done, what);
    return std::make_unique<NcclPending>(std::move(done), device_);
  }

  int device_;
  int rank_;
  int world_size_;
  double timeout_s_;
  c10::cuda::CUDAStream stream_;
  CompletionEvent ready_;  // re-recorded per collective: the stream wait copies its state
  ncclComm_t comm_ = nullptr;
  std::unique_ptr<NcclWatchdog> watchdog_;
  at::Tensor barrier_token_;
};

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(int device, double timeout_s) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    fail("NCCL communicator: MPI is not initialised (launch with mpirun: the NCCL id is "
         "broadcast over MPI)");
  }
  const int devices = c10::cuda::device_count();
  if (device < 0 || device >= devices)
    fail("NCCL communicator: CUDA device {} does not exist ({} visible)", device, devices);
  auto mpi = make_mpi_communicator(timeout_s);
  ncclUniqueId id{};
  if (mpi->rank() == 0) {
    const ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess)
      fail("NCCL ncclGetUniqueId failed on rank 0: {}", ncclGetErrorString(result));
  }
  at::Tensor id_bytes = at::from_blob(&id, {static_cast<int64_t>(sizeof(id))}, at::kByte);
  mpi->broadcast(id_bytes, 0);
  return std::make_shared<NcclCommunicator>(device, timeout_s, mpi->rank(), mpi->world_size(),
                                            id);
}

}  // namespace dspine::dist
