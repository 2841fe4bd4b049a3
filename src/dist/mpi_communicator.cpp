#include <mpi.h>

#include <cstdlib>

#include <ATen/ATen.h>

#include "core/error.h"
#include "dist/mpi_context.h"

namespace dspine::dist {
namespace {

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

void require_cpu_contiguous(const at::Tensor& tensor, const char* what) {
  if (!tensor.device().is_cpu() || !tensor.is_contiguous()) {
    fail("MPI communicator: {} needs a contiguous CPU tensor (got {} on {})", what,
         tensor.is_contiguous() ? "contiguous" : "non-contiguous", tensor.device().str());
  }
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "mpi"; }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    count_collective(static_cast<int64_t>(tensor.nbytes()));
    require_cpu_contiguous(tensor, "all_reduce");
    if (tensor.scalar_type() == at::kBFloat16 || tensor.scalar_type() == at::kHalf) {
      // MPI has no 16-bit float sum: reduce in fp32 and round once.
      at::Tensor wide = tensor.to(at::kFloat);
      all_reduce(wide, op);
      tensor.copy_(wide);
      return;
    }
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, tensor.data_ptr(), static_cast<int>(tensor.numel()),
                            mpi_type(tensor), op == ReduceOp::kMax ? MPI_MAX : MPI_SUM,
                            MPI_COMM_WORLD),
              "all_reduce");
    if (op == ReduceOp::kAvg) tensor.div_(world_size_);
  }

  void broadcast(at::Tensor& tensor, int root) override {
    count_collective();
    require_cpu_contiguous(tensor, "broadcast");
    check_mpi(MPI_Bcast(tensor.data_ptr(), static_cast<int>(tensor.nbytes()), MPI_BYTE, root,
                        MPI_COMM_WORLD),
              "broadcast");
  }

  void all_gather(const at::Tensor& input, at::Tensor& output) override {
    count_collective();
    require_cpu_contiguous(input, "all_gather input");
    require_cpu_contiguous(output, "all_gather output");
    if (output.nbytes() != input.nbytes() * static_cast<size_t>(world_size_)) {
      fail("MPI all_gather: output has {} bytes, expected {} x {}", output.nbytes(),
           world_size_, input.nbytes());
    }
    check_mpi(MPI_Allgather(input.data_ptr(), static_cast<int>(input.nbytes()), MPI_BYTE,
                            output.data_ptr(), static_cast<int>(input.nbytes()), MPI_BYTE,
                            MPI_COMM_WORLD),
              "all_gather");
  }

  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override {
    count_collective();
    require_cpu_contiguous(input, "reduce_scatter input");
    require_cpu_contiguous(output, "reduce_scatter output");
    if (input.numel() != output.numel() * world_size_) {
      fail("MPI reduce_scatter: input has {} elements, expected {} x {}", input.numel(),
           world_size_, output.numel());
    }
    check_mpi(MPI_Reduce_scatter_block(input.data_ptr(), output.data_ptr(),
                                       static_cast<int>(output.numel()), mpi_type(input),
                                       op == ReduceOp::kMax ? MPI_MAX : MPI_SUM, MPI_COMM_WORLD),
              "reduce_scatter");
    if (op == ReduceOp::kAvg) output.div_(world_size_);
  }

  void barrier() override { check_mpi(MPI_Barrier(MPI_COMM_WORLD), "barrier"); }

 private:
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
}

MpiContext::~MpiContext() {
  if (owns_) MPI_Finalize();
}

void MpiContext::abort(int code) const {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

std::shared_ptr<Communicator> make_mpi_communicator() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) fail("MPI communicator requested before MPI was initialised");
  return std::make_shared<MpiCommunicator>();
}

}  // namespace dspine::dist
