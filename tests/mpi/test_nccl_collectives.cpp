// The NCCL back end under mpirun -np 2 on a GPU machine (one GPU per rank; skipped without
// enough CUDA devices, so CPU CI passes): every collective and ReduceOp, sync and async, bf16
// and fp32, against the result computed locally from every rank's known contribution; results
// ordered on the caller's stream; memory freed right after an async collective stays intact.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "common/collective_suite.h"
#include "dist/launch.h"
#include "dist/nccl_communicator.h"

namespace dspine::dist {
namespace {

constexpr double kTimeoutS = 120;
const std::vector<at::ScalarType> kDtypes = {torch::kFloat, torch::kBFloat16};
const std::vector<int64_t> kSizes = {1, 1001, (int64_t{1} << 20) + 3};

class NcclCollectives : public ::testing::Test {
 protected:
  void SetUp() override {
    const RankLayout layout = rank_layout();
    // Every rank of a host sees the same device count, so all ranks skip together.
    if (c10::cuda::device_count() < layout.local_world_size) {
      GTEST_SKIP() << "needs one CUDA device per rank (" << c10::cuda::device_count()
                   << " visible, " << layout.local_world_size << " ranks on this host)";
    }
    device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(layout.local_rank));
    comm = make_nccl_communicator(layout.local_rank, kTimeoutS);
    place = [this](const at::Tensor& tensor) { return tensor.to(device); };
  }

  c10::Device device{c10::kCPU};
  std::shared_ptr<Communicator> comm;
  testing::Place place;
};

TEST_F(NcclCollectives, AllReduceMatchesTheLocalReduction) {
  ASSERT_EQ(comm->backend(), "nccl");
  testing::check_all_reduce(*comm, place, kDtypes, kSizes);
}

TEST_F(NcclCollectives, ReduceScatterGivesEachRankItsSliceOfTheReduction) {
  testing::check_reduce_scatter(*comm, place, kDtypes, kSizes);
}

TEST_F(NcclCollectives, AllGatherAndBroadcastCopyEveryRanksData) {
  testing::check_gather_and_broadcast(*comm, place, kDtypes, kSizes);
}

TEST_F(NcclCollectives, CountsEveryCollectiveAndTheBytesHandedToIt) {
  testing::check_counting(*comm, place);
}

// The collective must start after, and its result be seen by, the work of whatever stream is
// current: here a pool stream, with the input written there just before.
TEST_F(NcclCollectives, OrdersWithTheCallersCurrentStream) {
  auto side = c10::cuda::getStreamFromPool(false, device.index());
  c10::cuda::CUDAStreamGuard guard(side);
  const int64_t numel = int64_t{1} << 24;
  auto tensor = torch::empty({numel}, torch::dtype(torch::kFloat).device(device));
  tensor.fill_(static_cast<double>(comm->rank() + 1));  // queued on `side`
  auto pending = comm->all_reduce_async(tensor);
  pending->wait();
  auto doubled = tensor * 2;  // queued on `side` after the wait
  const double sum = comm->world_size() * (comm->world_size() + 1) / 2.0;
  EXPECT_TRUE(torch::equal(doubled.cpu(), torch::full({numel}, 2 * sum, torch::kFloat)));
}

// A tensor dropped right after all_reduce_async: its memory must not be handed to the next
// allocation on the caller's stream while NCCL may still write into it.
TEST_F(NcclCollectives, MemoryFreedAfterAnAsyncCollectiveIsNotReusedTooEarly) {
  const int64_t numel = int64_t{1} << 26;  // 256 MiB of fp32: the collective takes a while
  for (int round = 0; round < 5; ++round) {
    auto sent =
        torch::full({numel}, 1.0 + comm->rank(), torch::dtype(torch::kFloat).device(device));
    auto pending = comm->all_reduce_async(sent);
    sent.reset();
    auto reused = torch::empty({numel}, torch::dtype(torch::kFloat).device(device));
    reused.fill_(7.0);
    pending->wait();
    EXPECT_EQ(reused.ne(7.0).sum().item<int64_t>(), 0) << "round " << round;
  }
}

}  // namespace
}  // namespace dspine::dist
