// training.on_nonfinite on 2+ ranks (ctest: mpirun -np 2, MPI on CPU): a NaN in one micro-batch
// of rank 1 only. Every rank takes the same decision: skip leaves the weights of that step
// untouched on every rank and trains on; stop saves the state before the step and ends every
// rank with the same error.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "common/choice_named.h"
#include "common/mpi_world.h"
#include "common/nonfinite.h"
#include "common/small_run.h"
#include "core/config.h"
#include "core/error.h"
#include "core/files.h"
#include "dist/launch.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace {

dspine::core::Config config_for(const fs::path& dir, const std::string& mode,
                                const std::string& on_nonfinite) {
  auto config = dspine::testing::small_run_config(dir, 5);
  config.logging.metrics_file = "";
  config.distributed.sharding = dspine::testing::choice_named<dspine::core::Sharding>(mode);
  config.training.on_nonfinite =
      dspine::testing::choice_named<dspine::core::OnNonfinite>(on_nonfinite);
  return config;
}

// Rank 1 poisons micro-batch `micro` of step 2; the other ranks' data stays clean.
void poison_rank1(dspine::train::Trainer& trainer, dspine::dist::Communicator& comm,
                  int64_t micro) {
  if (comm.rank() == 1) trainer.set_batch_hook(dspine::testing::nan_at(2, micro));
}

// Whether every rank holds rank 0's weights.
bool same_on_every_rank(torch::nn::Module& module, dspine::dist::Communicator& comm) {
  bool same = true;
  for (const auto& item : module.named_parameters()) {
    auto mine = item.value().detach().to(torch::kFloat).contiguous().clone();
    auto leader = mine.clone();
    comm.broadcast(leader, 0);
    same = same && torch::equal(mine, leader);
  }
  return same;
}

}  // namespace

TEST(NonFinite, EveryRankSkipsTheStepAndTrainsOn) {
  auto comm = dspine::testing::mpi_world(120);
  const fs::path dir = dspine::testing::shared_dir(*comm, "skip");
  for (const std::string mode : {"none", "zero2"}) {
    dspine::train::Trainer trainer(config_for(dir / mode, mode, "skip"), comm);
    poison_rank1(trainer, *comm, 1);
    dspine::testing::StepRecorder steps(trainer);
    const auto result = trainer.run();
    EXPECT_EQ(result.final_step, 5) << mode;
    EXPECT_EQ(result.nonfinite_skipped, 1) << mode << " rank " << comm->rank();
    EXPECT_EQ(steps.changed, (std::vector<bool>{true, true, false, true, true}))
        << mode << " rank " << comm->rank();
    ASSERT_EQ(result.losses.size(), 5u);
    EXPECT_FALSE(std::isfinite(result.losses[2])) << mode << " rank " << comm->rank();
    EXPECT_TRUE(std::isfinite(result.losses[4])) << mode << " rank " << comm->rank();
    EXPECT_TRUE(same_on_every_rank(trainer.module(), *comm)) << mode;
  }
  comm->barrier();
  if (comm->rank() == 0) dspine::core::remove_tree(dir.string());
}

TEST(NonFinite, StopSavesTheStateBeforeTheStepAndEndsEveryRank) {
  auto comm = dspine::testing::mpi_world(120);
  const fs::path dir = dspine::testing::shared_dir(*comm, "stop");
  for (const std::string mode : {"none", "zero2", "zero3"}) {
    auto config = config_for(dir / mode, mode, "stop");
    dspine::train::Trainer trainer(config, comm);
    poison_rank1(trainer, *comm, 0);
    std::string message;
    try {
      trainer.run();
    } catch (const dspine::Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("step 3: the loss or gradient is not finite"), std::string::npos)
        << mode << " rank " << comm->rank() << ": " << message;
    EXPECT_NE(message.find("step-000002"), std::string::npos) << mode << ": " << message;
    // The saved state is the one before step 3: resuming it runs that step again, the same on
    // every rank, and with clean data it trains to the end.
    config.checkpoint.resume = "auto";
    dspine::train::Trainer resumed(config, comm);
    const auto rest = resumed.run();
    EXPECT_EQ(rest.first_step, 2) << mode;
    EXPECT_EQ(rest.final_step, 5) << mode;
    EXPECT_EQ(rest.nonfinite_skipped, 0) << mode;
    EXPECT_TRUE(same_on_every_rank(resumed.module(), *comm)) << mode;
  }
  comm->barrier();
  if (comm->rank() == 0) dspine::core::remove_tree(dir.string());
}
