#include <mpi.h>

#include <climits>
#include <cstdio>
#include <functional>
#include <utility>

#include <ATen/ATen.h>

#include "core/error.h"
#include "dist/collective_checks.h"
#include "dist/deadline.h"
#include "dist/launch.h"
#include "dist/mpi_context.h"

namespace dspine::dist {
namespace {

constexpr const char* kBackend = "MPI";

void check_mpi(int code, const char* what) {
  if (code != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    fail("MPI {} failed: {}", what, std::string(text, length));
  }
}

MPI_Datatype mpi_type(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kLong: return MPI_INT64_T;
    case at::kInt: return MPI_INT32_T;
    case at::kByte: return MPI_UINT8_T;
    case at::kBool: return MPI_C_BOOL;
    default: fail("MPI communicator: unsupported dtype {}", c10::toString(tensor.scalar_type()));
  }
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM; }

// MPI counts are ints; larger payloads would need chunking, which nothing here sends yet.
int mpi_count(size_t count, const char* what) {
  if (count > static_cast<size_t>(INT_MAX))
    fail("MPI {}: {} elements exceed MPI's int count", what, count);
  return static_cast<int>(count);
}

// MPI has no 16-bit float sum: 16-bit floats are reduced in an fp32 temporary and rounded once.
at::Tensor reduction_buffer(const at::Tensor& tensor) {
  const auto dtype = tensor.scalar_type();
  return dtype == at::kBFloat16 || dtype == at::kHalf ? tensor.to(at::kFloat) : tensor;
}

// After the reduction into `buffer`: divide for an average, round back into `result`.
void finish_reduction(at::Tensor result, at::Tensor buffer, ReduceOp op, int world_size) {
  if (op == ReduceOp::kAvg) buffer.div_(world_size);
  if (!buffer.is_same(result)) result.copy_(buffer);
}

// A started MPI collective. wait() polls MPI_Test until it completes, ending the job if that
// takes longer than timeout_s, then runs the finishing step (average, copy back), which also
// keeps the buffers alive until then.
class MpiPending final : public PendingCollective {
 public:
  MpiPending(MPI_Request request, const char* collective, int rank, double timeout_s,
             std::function<void()> finish)
      : request_(request),
        collective_(collective),
        rank_(rank),
        timeout_s_(timeout_s),
        finish_(std::move(finish)) {}
  // MPI may not free a request (or its buffers) before it completes.
  ~MpiPending() override { wait(); }

  void wait() override {
    if (finished_) return;
    const bool done = poll_until(
        [&] {
          int flag = 0;
          check_mpi(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), collective_);
          return flag != 0;
        },
        timeout_s_);
    if (!done) {
      abort_job(rank_, fmt::format("MPI {} did not finish within {} s (another rank failed or "
                                   "stopped)",
                                   collective_, timeout_s_));
    }
    finished_ = true;
    if (finish_) finish_();
  }

 private:
  MPI_Request request_;
  const char* collective_;
  int rank_;
  double timeout_s_;
  std::function<void()> finish_;
  bool finished_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(double timeout_s) : timeout_s_(timeout_s) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "mpi"; }
  bool reduces_device_tensors() const override { return false; }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    all_reduce_async(tensor, op)->wait();
  }
  void broadcast(at::Tensor& tensor, int root) override {
    const char* what = "broadcast";
    require_cpu(tensor, what);
    count_collective(Collective::kBroadcast, static_cast<int64_t>(tensor.nbytes()));
    MPI_Request request;
    check_mpi(MPI_Ibcast(tensor.data_ptr(), mpi_count(tensor.nbytes(), what), MPI_BYTE, root,
                         MPI_COMM_WORLD, &request),
              what);
    pending(request, what, nullptr)->wait();
  }
  void all_gather(const at::Tensor& input, at::Tensor& output) override {
    all_gather_async(input, output)->wait();
  }
  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override {
    reduce_scatter_async(input, output, op)->wait();
  }
  void barrier() override {
    MPI_Request request;
    check_mpi(MPI_Ibarrier(MPI_COMM_WORLD, &request), "barrier");
    pending(request, "barrier", nullptr)->wait();
  }

  std::unique_ptr<PendingCollective> all_reduce_async(at::Tensor& tensor, ReduceOp op) override {
    const char* what = "all_reduce";
    require_cpu(tensor, what);
    check_reduce_op(tensor, op, kBackend, what);
    count_collective(Collective::kAllReduce, static_cast<int64_t>(tensor.nbytes()));
    at::Tensor buffer = reduction_buffer(tensor);
    MPI_Request request;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buffer.data_ptr(), mpi_count(buffer.numel(), what),
                             mpi_type(buffer), mpi_op(op), MPI_COMM_WORLD, &request),
              what);
    return pending(request, what, [tensor, buffer, op, n = world_size_] {
      finish_reduction(tensor, buffer, op, n);
    });
  }

  std::unique_ptr<PendingCollective> all_gather_async(const at::Tensor& input,
                                                      at::Tensor& output) override {
    const char* what = "all_gather";
    require_cpu(input, what);
    require_cpu(output, what);
    check_gather_sizes(input, output, world_size_, kBackend);
    count_collective(Collective::kAllGather, static_cast<int64_t>(input.nbytes()));
    const int count = mpi_count(input.nbytes(), what);
    MPI_Request request;
    check_mpi(MPI_Iallgather(input.data_ptr(), count, MPI_BYTE, output.data_ptr(), count,
                             MPI_BYTE, MPI_COMM_WORLD, &request),
              what);
    return pending(request, what, [input, output] {});
  }

  std::unique_ptr<PendingCollective> reduce_scatter_async(const at::Tensor& input,
                                                          at::Tensor& output,
                                                          ReduceOp op) override {
    const char* what = "reduce_scatter";
    require_cpu(input, what);
    require_cpu(output, what);
    check_scatter_sizes(input, output, world_size_, kBackend);
    check_reduce_op(input, op, kBackend, what);
    count_collective(Collective::kReduceScatter, static_cast<int64_t>(input.nbytes()));
    const at::Tensor send = reduction_buffer(input);
    at::Tensor receive = send.is_same(input) ? output : at::empty_like(output, send.options());
    MPI_Request request;
    check_mpi(MPI_Ireduce_scatter_block(send.data_ptr(), receive.data_ptr(),
                                        mpi_count(receive.numel(), what), mpi_type(send),
                                        mpi_op(op), MPI_COMM_WORLD, &request),
              what);
    return pending(request, what, [send, receive, output, op, n = world_size_] {
      finish_reduction(output, receive, op, n);
    });
  }

 private:
  void require_cpu(const at::Tensor& tensor, const char* what) const {
    require_contiguous_on(tensor, c10::Device(c10::kCPU), kBackend, what);
  }
  std::unique_ptr<PendingCollective> pending(MPI_Request request, const char* what,
                                             std::function<void()> finish) const {
    return std::make_unique<MpiPending>(request, what, rank_, timeout_s_, std::move(finish));
  }

  double timeout_s_;
  int rank_ = 0;
  int world_size_ = 1;
};

}  // namespace

MpiContext::MpiContext(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    check_mpi(MPI_Init(argc, argv), "init");
    owns_ = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  rank_layout();  // its collective part, on every rank while all are here
}

MpiContext::~MpiContext() {
  if (owns_) MPI_Finalize();
}

void MpiContext::abort(int code) const { end_job(code); }

int MpiContext::fail_run(const std::exception& error) const {
  const char* kind = dynamic_cast<const Error*>(&error) != nullptr ? "error" : "internal error";
  if (world_size_ == 1) {
    std::fprintf(stderr, "%s: %s\n", kind, error.what());
    return 1;
  }
  std::fprintf(stderr, "%s (rank %d): %s\n", kind, rank_, error.what());
  abort(1);
}

std::shared_ptr<Communicator> make_mpi_communicator(double timeout_s) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) fail("MPI communicator requested before MPI was initialised");
  if (!(timeout_s > 0)) fail("distributed.timeout_s must be > 0 (got {})", timeout_s);
  return std::make_shared<MpiCommunicator>(timeout_s);
}

}  // namespace dspine::dist
