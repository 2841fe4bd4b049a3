// The checks every collective back end passes, run under mpirun: each rank contributes a known
// tensor f(r) and compares its result with the one computed locally from every f(r). `place`
// moves a CPU tensor where the back end wants it (identity for MPI, the rank's GPU for NCCL).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dist/communicator.h"

namespace dspine::testing {

using Place = std::function<at::Tensor(const at::Tensor&)>;

// Rank r's contribution: distinct per rank and element, exact in bf16 (small integers), so
// sums, maxima and averages of two ranks are exact in every dtype tested.
inline at::Tensor contribution(int rank, int64_t numel, at::ScalarType dtype) {
  auto index = torch::arange(numel, torch::kLong);
  return ((index * 3 + rank * 5) % 17 - 8 + rank).to(dtype);
}

// The element-wise reduction of every rank's contribution.
inline at::Tensor expected_reduction(int world_size, int64_t numel, at::ScalarType dtype,
                                     dist::ReduceOp op) {
  auto result = contribution(0, numel, torch::kDouble);
  for (int r = 1; r < world_size; ++r) {
    auto next = contribution(r, numel, torch::kDouble);
    result = op == dist::ReduceOp::kMax ? torch::maximum(result, next) : result + next;
  }
  if (op == dist::ReduceOp::kAvg) result = result / world_size;
  return result.to(dtype);
}

// Every rank's contribution, concatenated in rank order (what all_gather returns).
inline at::Tensor expected_gather(int world_size, int64_t numel, at::ScalarType dtype) {
  std::vector<at::Tensor> parts;
  for (int r = 0; r < world_size; ++r) parts.push_back(contribution(r, numel, dtype));
  return torch::cat(parts);
}

// Averages are defined for floating-point tensors only.
inline std::vector<dist::ReduceOp> ops_for(at::ScalarType dtype) {
  if (!at::isFloatingType(dtype)) return {dist::ReduceOp::kSum, dist::ReduceOp::kMax};
  return {dist::ReduceOp::kSum, dist::ReduceOp::kAvg, dist::ReduceOp::kMax};
}

inline std::string describe(at::ScalarType dtype, int64_t numel, dist::ReduceOp op) {
  static const char* const kOps[] = {"sum", "avg", "max"};
  return std::string(c10::toString(dtype)) + ", " + std::to_string(numel) + " elements, " +
         kOps[static_cast<int>(op)];
}

// all_reduce, sync and async, for every dtype, size and op.
inline void check_all_reduce(dist::Communicator& comm, const Place& place,
                             const std::vector<at::ScalarType>& dtypes,
                             const std::vector<int64_t>& sizes) {
  for (auto dtype : dtypes) {
    for (int64_t numel : sizes) {
      for (dist::ReduceOp op : ops_for(dtype)) {
        const auto expected = expected_reduction(comm.world_size(), numel, dtype, op);
        auto sync = place(contribution(comm.rank(), numel, dtype));
        comm.all_reduce(sync, op);
        EXPECT_TRUE(torch::equal(sync.cpu(), expected)) << describe(dtype, numel, op);
        auto async = place(contribution(comm.rank(), numel, dtype));
        auto pending = comm.all_reduce_async(async, op);
        pending->wait();
        EXPECT_TRUE(torch::equal(async.cpu(), expected)) << "async " << describe(dtype, numel, op);
      }
    }
  }
}

// reduce_scatter, sync and async: each rank gets its slice of the reduction.
inline void check_reduce_scatter(dist::Communicator& comm, const Place& place,
                                 const std::vector<at::ScalarType>& dtypes,
                                 const std::vector<int64_t>& sizes) {
  const int n = comm.world_size();
  for (auto dtype : dtypes) {
    for (int64_t numel : sizes) {
      for (dist::ReduceOp op : ops_for(dtype)) {
        const auto full = expected_reduction(n, numel * n, dtype, op);
        const auto expected = full.slice(0, comm.rank() * numel, (comm.rank() + 1) * numel);
        const auto input = place(contribution(comm.rank(), numel * n, dtype));
        auto sync = place(torch::full({numel}, -99, dtype));
        comm.reduce_scatter(input, sync, op);
        EXPECT_TRUE(torch::equal(sync.cpu(), expected)) << describe(dtype, numel, op);
        auto async = place(torch::full({numel}, -99, dtype));
        comm.reduce_scatter_async(input, async, op)->wait();
        EXPECT_TRUE(torch::equal(async.cpu(), expected)) << "async " << describe(dtype, numel, op);
      }
    }
  }
}

// all_gather (sync into a flat output, async into a [n, numel] one) and broadcast from every
// root.
inline void check_gather_and_broadcast(dist::Communicator& comm, const Place& place,
                                       const std::vector<at::ScalarType>& dtypes,
                                       const std::vector<int64_t>& sizes) {
  const int n = comm.world_size();
  for (auto dtype : dtypes) {
    for (int64_t numel : sizes) {
      const std::string what = std::string(c10::toString(dtype)) + ", " + std::to_string(numel);
      const auto expected = expected_gather(n, numel, dtype);
      const auto input = place(contribution(comm.rank(), numel, dtype));
      auto sync = place(torch::zeros({numel * n}, dtype));
      comm.all_gather(input, sync);
      EXPECT_TRUE(torch::equal(sync.cpu(), expected)) << what;
      auto async = place(torch::zeros({n, numel}, dtype));
      comm.all_gather_async(input, async)->wait();
      EXPECT_TRUE(torch::equal(async.view(-1).cpu(), expected)) << "async " << what;
      for (int root = 0; root < n; ++root) {
        auto tensor = place(contribution(comm.rank(), numel, dtype));
        comm.broadcast(tensor, root);
        EXPECT_TRUE(torch::equal(tensor.cpu(), contribution(root, numel, dtype)))
            << "broadcast from " << root << ", " << what;
      }
    }
  }
  comm.barrier();
}

// collective_count and bytes_moved on a fresh communicator: every collective once, the bytes
// handed to it (barrier moves no payload and is not counted).
inline void check_counting(dist::Communicator& comm, const Place& place) {
  const int n = comm.world_size();
  auto reduced = place(torch::zeros({10}, torch::kFloat));                // 40 bytes
  auto bf16 = place(torch::zeros({3}, torch::kBFloat16));                 // 6 bytes
  auto broadcast = place(torch::zeros({5}, torch::kLong));                // 40 bytes
  const auto gather_in = place(torch::zeros({4}, torch::kFloat));         // 16 bytes
  auto gather_out = place(torch::zeros({4 * n}, torch::kFloat));
  const auto scatter_in = place(torch::zeros({2 * n}, torch::kFloat));    // 8n bytes
  auto scatter_out = place(torch::zeros({2}, torch::kFloat));
  comm.all_reduce(reduced, dist::ReduceOp::kMax);
  comm.all_reduce_async(bf16, dist::ReduceOp::kAvg)->wait();
  comm.broadcast(broadcast, 0);
  comm.all_gather(gather_in, gather_out);
  comm.reduce_scatter_async(scatter_in, scatter_out)->wait();
  comm.barrier();
  EXPECT_EQ(comm.collective_count(), 5);
  EXPECT_EQ(comm.bytes_moved(), 40 + 6 + 40 + 16 + 8 * n);
  EXPECT_EQ(comm.collective_count(dist::Collective::kAllReduce), 2);
  EXPECT_EQ(comm.bytes_moved(dist::Collective::kAllReduce), 46);
  EXPECT_EQ(comm.bytes_moved(dist::Collective::kBroadcast), 40);
  EXPECT_EQ(comm.bytes_moved(dist::Collective::kAllGather), 16);
  EXPECT_EQ(comm.bytes_moved(dist::Collective::kReduceScatter), 8 * n);
}

}  // namespace dspine::testing
