// The reference's test T29 on two CPU ranks (MPI back end): rank r takes rows 2·micro + r of a
// combined batch; after an accumulation window and the trainer's gradient SUM all-reduce, every
// rank's gradients equal the single-process gradients of the combined batch. The same holds for the
// reduced gradient slices of every sharding mode, zero3 gathering each unit (again in the backward
// and in the objective's checkpointed recompute).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "common/dspine_tiny.h"
#include "core/config.h"
#include "dist/mpi_context.h"
#include "dist/sharded_parameters.h"
#include "train/sharding_observer.h"

namespace dspine {
namespace {

std::map<std::string, torch::Tensor> window_gradients(objectives::DSpineObjective& objective,
                                                      const std::vector<data::DraftBatch>& batches,
                                                      dist::Communicator& comm) {
  objectives::StepContext context;
  context.step = 300;  // replacement schedule past its end: no replacement draws
  context.total_steps = 600;
  context.comm = &comm;
  context.seed = 11;
  objective.begin_window(batches, context);
  for (size_t i = 0; i < batches.size(); ++i) {
    objective.micro_step(batches[i], static_cast<int64_t>(i), context).loss.backward();
  }
  objective.end_window(context);
  std::map<std::string, torch::Tensor> grads;
  for (auto& p : objective.module()->named_parameters()) {
    auto grad = p.value().grad().defined() ? p.value().grad().clone() : torch::zeros_like(p.value());
    comm.all_reduce(grad);  // what the trainer does after a window
    grads[p.key()] = grad;
  }
  return grads;
}

// 2·accumulation rows with uneven masks whose valid anchors all fit num_anchors, so every split
// of them over ranks and micro-batches sees the same blocks.
std::vector<data::DraftBatch> uneven_rows(int64_t accumulation, int64_t seed) {
  const auto sparse = testing::mask_rows({{0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}});
  const auto dense = testing::mask_rows({{0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0}});
  std::vector<data::DraftBatch> rows;
  for (int64_t i = 0; i < 2 * accumulation; ++i) {
    rows.push_back(testing::random_batch(i % 3 ? dense : sparse, seed + i));
  }
  return rows;
}

// Rank r's micro-batches: row 2·micro + r of the combined batch.
std::vector<data::DraftBatch> rows_of_rank(const std::vector<data::DraftBatch>& rows, int rank) {
  std::vector<data::DraftBatch> mine;
  for (size_t micro = 0; 2 * micro + 1 < rows.size(); ++micro) {
    mine.push_back(rows[2 * micro + rank]);
  }
  return mine;
}

TEST(DSpineDistributed, UnevenRanksMatchTheCombinedBatch) {
  auto comm = dist::make_mpi_communicator(core::DistributedConfig{}.timeout_s);
  ASSERT_EQ(comm->world_size(), 2);
  // (accumulation, prepass): skip_first's first replay reduces CE and D across the ranks.
  using objectives::DSpinePrepass;
  const std::vector<std::pair<int64_t, DSpinePrepass>> windows = {
      {1, DSpinePrepass::kAll},       {2, DSpinePrepass::kAll},      {2, DSpinePrepass::kSkipFirst},
      {3, DSpinePrepass::kSkipFirst}, {2, DSpinePrepass::kKeepLast}, {3, DSpinePrepass::kKeepLast}};
  for (const auto& [accumulation, prepass] : windows) {
    const auto rows = uneven_rows(accumulation, 50);
    const auto mine = rows_of_rank(rows, comm->rank());
    auto settings = testing::tiny_settings();
    settings.prepass = prepass;
    auto distributed = testing::training_objective(testing::tiny_config(accumulation), settings);
    auto grads = window_gradients(*distributed, mine, *comm);

    auto single = testing::training_objective(testing::tiny_config(1), testing::tiny_settings());
    auto local = dist::make_single_process_communicator();
    auto expected = window_gradients(*single, {data::concat_rows(rows)}, *local);

    ASSERT_EQ(grads.size(), expected.size());
    for (const auto& [name, grad] : expected) {
      EXPECT_TRUE(torch::allclose(grads.at(name), grad, 2e-4, 2e-5))
          << "A = " << accumulation << " prepass " << static_cast<int>(prepass) << " rank "
          << comm->rank() << " " << name << " max diff "
          << (grads.at(name) - grad).abs().max().item<double>();
    }
  }
}


TEST(DSpineDistributed, ShardedGradientSlicesMatchTheCombinedBatch) {
  auto comm = dist::make_mpi_communicator(core::DistributedConfig{}.timeout_s);
  ASSERT_EQ(comm->world_size(), 2);
  const int64_t accumulation = 2;
  const auto rows = uneven_rows(accumulation, 70);
  const auto mine = rows_of_rank(rows, comm->rank());
  // Objective chunks of 1 block: the loss terms are recomputed in the backward.
  auto single = testing::training_objective(testing::tiny_config(1), testing::tiny_settings(1));
  auto local = dist::make_single_process_communicator();
  const auto expected = window_gradients(*single, {data::concat_rows(rows)}, *local);

  // keep_last: the last micro-batch's prepass keeps its graph through the first replay's
  // backward, so zero3 gathers its units again for a backward two forwards later.
  using objectives::DSpinePrepass;
  for (const auto& [mode, prepass] :
       {std::pair{core::Sharding::kNone, DSpinePrepass::kAll},
        std::pair{core::Sharding::kZero2, DSpinePrepass::kAll},
        std::pair{core::Sharding::kZero3, DSpinePrepass::kAll},
        std::pair{core::Sharding::kZero3, DSpinePrepass::kKeepLast}}) {
    auto settings = testing::tiny_settings(1);
    settings.prepass = prepass;
    auto objective = testing::training_objective(testing::tiny_config(accumulation), settings);
    dist::ShardedParameters sharded(*objective->module(), comm, mode);
    train::attach_sharding(*objective->module(), sharded, "dspine");
    objectives::StepContext context;
    context.step = 300;
    context.total_steps = 600;
    context.comm = comm.get();
    context.seed = 11;
    objective->begin_window(mine, context);
    for (int64_t i = 0; i < accumulation; ++i) {
      auto loss = objective->micro_step(mine[i], i, context).loss;
      sharded.begin_backward(i + 1 == accumulation);
      loss.backward();
    }
    objective->end_window(context);
    sharded.finish_gradient_sync();
    for (auto& unit : sharded.units()) {
      // The single-process gradient of the unit, flattened and padded like the unit.
      std::vector<torch::Tensor> flat;
      for (const auto& item : unit.parameters()) {
        flat.push_back(expected.at(item.first).reshape(-1));
      }
      auto whole = torch::cat(flat);
      const int64_t end = unit.shard_offset() + unit.shard_numel();
      if (end > whole.numel()) whole = torch::constant_pad_nd(whole, {0, end - whole.numel()});
      const auto slice = whole.narrow(0, unit.shard_offset(), unit.shard_numel());
      const auto got = unit.gradient().narrow(0, 0, unit.shard_numel());
      EXPECT_TRUE(torch::allclose(got, slice, 2e-4, 2e-5))
          << "mode " << static_cast<int>(mode) << " prepass " << static_cast<int>(prepass)
          << " rank " << comm->rank() << " unit " << unit.name() << " max diff "
          << (got - slice).abs().max().item<double>();
    }
    // zero3 frees every unit it gathered once its backward is done.
    if (mode == core::Sharding::kZero3) {
      for (auto& unit : sharded.units()) {
        EXPECT_EQ(unit.resident(), unit.name() == "head") << unit.name();
      }
    }
  }
}

}  // namespace
}  // namespace dspine
