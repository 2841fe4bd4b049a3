// The MPI back end under mpirun -np 2: every collective and ReduceOp, sync and async, fp32,
// fp64, int64 and bf16 at odd sizes, against the result computed locally from every rank's
// known contribution; counting; argument errors.
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/collective_suite.h"
#include "common/expect_error.h"
#include "dist/mpi_context.h"

namespace dspine::dist {
namespace {

constexpr double kTimeoutS = 60;
const std::vector<at::ScalarType> kDtypes = {torch::kFloat, torch::kDouble, torch::kLong,
                                             torch::kBFloat16};
const std::vector<int64_t> kSizes = {1, 7, 1001};

at::Tensor on_cpu(const at::Tensor& tensor) { return tensor; }

class MpiCollectives : public ::testing::Test {
 protected:
  std::shared_ptr<Communicator> comm = make_mpi_communicator(kTimeoutS);
};

TEST_F(MpiCollectives, AllReduceMatchesTheLocalReduction) {
  ASSERT_EQ(comm->world_size(), 2);
  ASSERT_EQ(comm->backend(), "mpi");
  testing::check_all_reduce(*comm, on_cpu, kDtypes, kSizes);
}

TEST_F(MpiCollectives, ReduceScatterGivesEachRankItsSliceOfTheReduction) {
  testing::check_reduce_scatter(*comm, on_cpu, kDtypes, kSizes);
}

TEST_F(MpiCollectives, AllGatherAndBroadcastCopyEveryRanksData) {
  testing::check_gather_and_broadcast(*comm, on_cpu, kDtypes, kSizes);
}

TEST_F(MpiCollectives, CountsEveryCollectiveAndTheBytesHandedToIt) {
  testing::check_counting(*comm, on_cpu);
}

TEST_F(MpiCollectives, AsyncCollectivesCompleteInAnyWaitOrder) {
  using testing::contribution;
  using testing::expected_reduction;
  const int n = comm->world_size();
  auto first = contribution(comm->rank(), 513, torch::kFloat);
  auto second = contribution(comm->rank(), 257, torch::kBFloat16);
  const auto second_input = second.clone();
  auto gathered = torch::zeros({257 * n}, torch::kBFloat16);
  auto a = comm->all_reduce_async(first, ReduceOp::kMax);
  auto b = comm->all_gather_async(second_input, gathered);
  auto c = comm->all_reduce_async(second, ReduceOp::kAvg);
  c->wait();
  a->wait();
  b->wait();
  EXPECT_TRUE(torch::equal(first, expected_reduction(n, 513, torch::kFloat, ReduceOp::kMax)));
  EXPECT_TRUE(
      torch::equal(second, expected_reduction(n, 257, torch::kBFloat16, ReduceOp::kAvg)));
  EXPECT_TRUE(torch::equal(gathered, testing::expected_gather(n, 257, torch::kBFloat16)));
}

TEST_F(MpiCollectives, MismatchedArgumentsFailNamingTheCollective) {
  auto input = torch::zeros({3}, torch::kFloat);
  auto output = torch::zeros({5}, torch::kFloat);
  testing::expect_error([&] { comm->all_gather(input, output); }, "MPI all_gather");
  auto integers = torch::zeros({3}, torch::kLong);
  testing::expect_error_mentioning([&] { comm->all_reduce(integers, ReduceOp::kAvg); },
                                   {"MPI all_reduce", "kAvg"});
  auto strided = torch::zeros({4, 4}, torch::kFloat).t();
  testing::expect_error_mentioning([&] { comm->all_reduce(strided); },
                                   {"MPI all_reduce", "non-contiguous"});
  EXPECT_EQ(comm->collective_count(), 0);  // rejected before anything was sent
}

}  // namespace
}  // namespace dspine::dist
