// Two ranks (mpirun -np 2, MPI back end on CPU) train exactly like one process on the combined
// batch: rank r reads rows r·B..(r+1)·B-1 of each global micro-batch and gradients add up.
#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/config.h"
#include "core/files.h"
#include "dist/mpi_context.h"
#include "common/small_run.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace {

dspine::core::Config small_config(const fs::path& dir, int64_t rows) {
  auto config = dspine::testing::small_run_config(dir, 4, rows);
  config.logging.metrics_file = "";
  return config;
}

}  // namespace

TEST(DataParallel, TwoRanksMatchOneProcessOnTheCombinedBatch) {
  const double timeout_s = dspine::core::DistributedConfig{}.timeout_s;
  auto comm = dspine::dist::make_mpi_communicator(timeout_s);
  ASSERT_EQ(comm->world_size(), 2);
  // Same directory name on both ranks (rank 0 writes checkpoints); unique per run.
  auto stamp = torch::tensor({static_cast<int64_t>(::getpid())}, torch::kLong);
  comm->broadcast(stamp, 0);
  const fs::path dir =
      fs::temp_directory_path() / ("dspine_mpi_" + std::to_string(stamp.item<int64_t>()));

  dspine::train::Trainer distributed(small_config(dir / "dp", 2), comm);
  auto dp = distributed.run();

  // Every rank also computes the single-process reference with the combined batch.
  dspine::train::Trainer single(small_config(dir / ("single" + std::to_string(comm->rank())), 4),
                                dspine::dist::make_single_process_communicator());
  auto reference = single.run();

  ASSERT_EQ(dp.losses.size(), reference.losses.size());
  for (size_t i = 0; i < dp.losses.size(); ++i) {
    EXPECT_NEAR(dp.losses[i], reference.losses[i], 1e-5 * std::abs(reference.losses[i]))
        << "step " << i;
  }
  auto expected = single.module().named_parameters();
  for (const auto& item : distributed.module().named_parameters()) {
    EXPECT_TRUE(torch::allclose(item.value(), expected[item.key()], 2e-5, 1e-6)) << item.key();
  }
  comm->barrier();
  if (comm->rank() == 0) dspine::core::remove_tree(dir.string());
}
