// dspine.md T29 on two CPU ranks (MPI back end): rank r takes rows 2·micro + r of a combined
// batch; after an accumulation window and the trainer's gradient SUM all-reduce, every rank's
// gradients equal the single-process gradients of the combined batch.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/dspine_tiny.h"
#include "core/config.h"
#include "dist/mpi_context.h"

namespace dspine {
namespace {

std::map<std::string, torch::Tensor> window_gradients(objectives::DSpineObjective& objective,
                                                      const std::vector<data::DraftBatch>& batches,
                                                      dist::Communicator& comm) {
  objectives::StepContext context;
  context.step = 300;  // replacement schedule past its end: no replacement draws
  context.total_steps = 600;
  context.comm = &comm;
  context.generator = at::make_generator<at::CPUGeneratorImpl>(11);
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

TEST(DSpineDistributed, UnevenRanksMatchTheCombinedBatch) {
  auto comm = dist::make_mpi_communicator(core::DistributedConfig{}.timeout_s);
  ASSERT_EQ(comm->world_size(), 2);
  // Uneven masks whose valid anchors all fit num_anchors, so every split sees the same blocks.
  const auto sparse = testing::mask_rows({{0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}});
  const auto dense = testing::mask_rows({{0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0}});
  for (int64_t accumulation : {1, 2}) {
    std::vector<data::DraftBatch> rows;
    for (int64_t i = 0; i < 2 * accumulation; ++i) {
      rows.push_back(testing::random_batch(i % 3 ? dense : sparse, 50 + i));
    }
    std::vector<data::DraftBatch> mine;
    for (int64_t micro = 0; micro < accumulation; ++micro) {
      mine.push_back(rows[2 * micro + comm->rank()]);
    }
    auto distributed = testing::training_objective(testing::tiny_config(0, accumulation));
    auto grads = window_gradients(*distributed, mine, *comm);

    auto single = testing::training_objective(testing::tiny_config(0, 1));
    auto local = dist::make_single_process_communicator();
    auto expected = window_gradients(*single, {data::concat_rows(rows)}, *local);

    ASSERT_EQ(grads.size(), expected.size());
    for (const auto& [name, grad] : expected) {
      EXPECT_TRUE(torch::allclose(grads.at(name), grad, 2e-4, 2e-5))
          << "A = " << accumulation << " rank " << comm->rank() << " " << name << " max diff "
          << (grads.at(name) - grad).abs().max().item<double>();
    }
  }
}

}  // namespace
}  // namespace dspine
