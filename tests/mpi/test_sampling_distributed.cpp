// The objectives' random draws (anchors, replacement masks, GSPO rollout samples) are keyed by
// (training.seed, step, global row) (objectives/row_streams.h), not by rank: N ranks at
// training.batch_size B (ctest: mpirun -np 2, MPI back end on CPU) train like one process at
// N·B, step by step, for the dspine and gspo objectives under every distributed.sharding mode.
// Anchors are drawn from more valid positions than num_anchors and replacement is on, so the draws
// matter; only fp32 summation order differs (1e-5 relative on every step's loss).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "common/choice_named.h"
#include "common/mpi_world.h"
#include "common/small_run.h"
#include "core/config.h"
#include "core/files.h"
#include "dist/launch.h"
#include "dist/mpi_context.h"
#include "objectives/gspo_objective.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace {

constexpr int64_t kSteps = 3;

dspine::core::Config run_config(const fs::path& dir, const std::string& objective, int64_t rows,
                                const std::string& mode) {
  auto config = dspine::testing::tiny_dspine_run_config(dir, kSteps);
  config.training.device = dspine::core::Device::kCpu;
  config.training.batch_size = rows;
  config.training.accumulation_steps = 2;
  config.training.eval_every = 0;
  config.data.seq_len = 32;  // 31 anchor positions per full row for num_anchors 16
  config.distributed.sharding = dspine::testing::choice_named<dspine::core::Sharding>(mode);
  if (objective == "gspo") {
    // The policy loss alone is a near-cancellation (on policy it is Σ advantages = 0): its fp32
    // rounding is 1e-5 of its size. With the supervised term beside it the loss is not; the
    // rollout's own figures (reward, log-probabilities of the sampled tokens) are compared too.
    config.objective.name = "gspo";
    dspine::objectives::GspoSettings gspo;
    gspo.rollout.group_size = 3;
    gspo.rollout.reward = dspine::objectives::GspoReward::kExpectedAcceptance;
    gspo.updates_per_rollout = 2;
    gspo.ce_weight = 0.5;
    config.set_section("objective.gspo", gspo);
  }
  return config;
}

void expect_same_losses(const std::string& objective) {
  auto comm = dspine::testing::mpi_world(300);
  const int ranks = comm->world_size();
  ASSERT_GE(ranks, 2);
  const int64_t rows = 2;
  const fs::path dir = dspine::testing::shared_dir(*comm, "sampling_" + objective);
  // Every rank computes the single-process reference at the combined batch.
  dspine::train::Trainer reference(
      run_config(dir / ("single" + std::to_string(comm->rank())), objective, ranks * rows, "none"),
      dspine::dist::make_single_process_communicator());
  const auto expected = reference.run();
  ASSERT_EQ(expected.losses.size(), static_cast<size_t>(kSteps));
  for (const std::string mode : {"none", "zero2", "zero3"}) {
    dspine::train::Trainer trainer(run_config(dir / mode, objective, rows, mode), comm);
    const auto got = trainer.run();
    ASSERT_EQ(got.losses.size(), expected.losses.size()) << mode;
    double worst = 0;  // the largest relative loss difference, for the log
    for (size_t i = 0; i < got.losses.size(); ++i) {
      worst = std::max(worst, std::abs(got.losses[i] - expected.losses[i]) /
                                  std::abs(expected.losses[i]));
      EXPECT_NEAR(got.losses[i], expected.losses[i], 1e-5 * std::abs(expected.losses[i]))
          << objective << " " << mode << " step " << i + 1;
      // The sampled blocks themselves: their rewards and log-probabilities (gspo), their
      // supervision (dspine).
      for (const char* term : {"gspo/reward", "gspo/new_logprobs", "gspo/segments",
                               "gspo/dspine_loss", "dspine/denominator"}) {
        if (!expected.terms[i].count(term)) continue;
        const double want = expected.terms[i].at(term);
        EXPECT_NEAR(got.terms[i].at(term), want, 1e-5 * std::max(1.0, std::abs(want)))
            << objective << " " << mode << " step " << i + 1 << " " << term;
      }
    }
    if (comm->rank() == 0) {
      std::printf("%s %s: largest relative loss difference %.3g over %zu steps\n",
                  objective.c_str(), mode.c_str(), worst, got.losses.size());
    }
  }
  comm->barrier();
  if (comm->rank() == 0) dspine::core::remove_tree(dir.string());
}

}  // namespace

TEST(SamplingDistributed, DSpineRanksDrawLikeOneProcessOnTheCombinedBatch) {
  expect_same_losses("dspine");
}

TEST(SamplingDistributed, GspoRanksDrawLikeOneProcessOnTheCombinedBatch) {
  expect_same_losses("gspo");
}
