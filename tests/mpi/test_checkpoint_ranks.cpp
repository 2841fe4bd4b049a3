// Checkpoints across ranks (ctest: mpirun -np 2, MPI on CPU): a rank that cannot write its part
// fails every rank's save instead of leaving the others in a barrier, and resume: auto makes
// every rank fall back to the same older checkpoint when the newest is damaged.
#include <filesystem>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/mpi_world.h"
#include "common/small_run.h"
#include "core/config.h"
#include "core/error.h"
#include "core/files.h"
#include "dist/launch.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace {

// Four steps on every rank, saved every two: step-000002 and step-000004.
dspine::core::Config two_checkpoints(const fs::path& dir,
                                     const std::shared_ptr<dspine::dist::Communicator>& comm) {
  auto config = dspine::testing::small_run_config(dir, 4);
  config.logging.metrics_file = "";
  config.checkpoint.save_every = 2;
  dspine::train::Trainer(config, comm).run();
  config.checkpoint.resume = "auto";
  return config;
}

}  // namespace

TEST(CheckpointRanks, ARankThatCannotWriteFailsEveryRank) {
  auto comm = dspine::testing::mpi_world(60);
  const auto dir = dspine::testing::shared_dir(*comm, "save_failure");
  const auto config = two_checkpoints(dir, comm);
  const auto newest = fs::path(config.checkpoint.dir) / "step-000004";
  const auto loaded = dspine::train::load_checkpoint(newest.string(), comm->rank(),
                                                     comm->world_size(), true);
  const dspine::train::CheckpointContents contents{loaded.model.tensors, loaded.model_config,
                                                   loaded.optimizer.at(0).tensors,
                                                   loaded.rng.tensors, loaded.trainer_state};
  dspine::train::CheckpointManager manager(config.checkpoint.dir, 0, *comm);
  std::string message;
  try {
    manager.save(6, contents, [&](const std::string& file) {
      if (comm->rank() == 1) {
        throw dspine::Error("cannot write " + file + ": No space left on device");
      }
    });
  } catch (const dspine::Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("cannot save checkpoint step-000006"), std::string::npos) << message;
  EXPECT_NE(message.find(comm->rank() == 1 ? "No space left on device" : "another rank failed"),
            std::string::npos)
      << message;
  comm->barrier();
  EXPECT_FALSE(fs::exists(fs::path(config.checkpoint.dir) / ".tmp-step-000006"));
  EXPECT_EQ(manager.latest(), newest.string());
  EXPECT_NO_THROW(dspine::train::verify_checkpoint(newest.string()));
}

TEST(CheckpointRanks, EveryRankFallsBackToTheSameCheckpoint) {
  auto comm = dspine::testing::mpi_world(60);
  const auto dir = dspine::testing::shared_dir(*comm, "fallback");
  auto config = two_checkpoints(dir, comm);
  const auto newest = fs::path(config.checkpoint.dir) / "step-000004";
  if (comm->rank() == 0) {
    const auto shard = newest / dspine::train::optimizer_shard_name(1, comm->world_size());
    fs::resize_file(shard, fs::file_size(shard) - 1);
  }
  comm->barrier();
  config.training.total_steps = 6;
  dspine::train::Trainer resumed(config, comm);
  const auto result = resumed.run();
  EXPECT_EQ(result.first_step, 2);
  EXPECT_EQ(result.final_step, 6);
  comm->barrier();
  int set_aside = 0;
  for (const auto& entry : fs::directory_iterator(config.checkpoint.dir)) {
    set_aside += entry.path().filename().string().rfind(".invalid-step-000004-", 0) == 0;
  }
  EXPECT_EQ(set_aside, 1);
}
