// Checkpoint integrity: checksums, falling back past bad checkpoints, setting newer ones aside,
// the resume configuration check, saves that fail (full disk, unusable directory), and every
// other load of a checkpoint's weights (training.init_from, export, an export's own manifest)
// refusing a corrupt file as resume does.
#include <sys/resource.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "common/expect_error.h"
#include "common/small_run.h"
#include "core/checksum.h"
#include "core/config.h"
#include "core/files.h"
#include "dist/communicator.h"
#include "train/checkpoint.h"
#include "train/config_diff.h"
#include "objectives/gspo_objective.h"
#include "train/hf_export.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using dspine::core::Config;
using dspine::testing::expect_error;
using dspine::testing::expect_error_mentioning;

namespace {

fs::path fresh_dir(const std::string& name) {
  auto dir = fs::temp_directory_path() /
             ("dspine_integrity_" + name + "_" + std::to_string(::getpid()));
  dspine::core::remove_tree(dir.string());
  fs::create_directories(dir);
  return dir;
}

dspine::train::TrainResult train(const Config& config) {
  return dspine::train::Trainer(config, dspine::dist::make_single_process_communicator()).run();
}

// Four steps saved every two: step-000002 and step-000004.
Config two_checkpoints(const fs::path& dir) {
  auto config = dspine::testing::small_run_config(dir, 4);
  config.checkpoint.save_every = 2;
  train(config);
  config.checkpoint.resume = "auto";
  return config;
}

fs::path checkpoint(const Config& config, int64_t step) {
  return fs::path(config.checkpoint.dir) / dspine::train::checkpoint_name(step);
}

void flip_byte(const fs::path& file, std::streamoff at) {
  std::fstream data(file, std::ios::in | std::ios::out | std::ios::binary);
  data.seekg(at);
  char byte = 0;
  data.get(byte);
  data.seekp(at);
  data.put(static_cast<char>(byte ^ 0x5a));
}

// Names in checkpoint.dir that start with `prefix`.
std::vector<std::string> entries_starting(const Config& config, const std::string& prefix) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(config.checkpoint.dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  return names;
}

// Trains on from a damaged step-000004 with resume: auto; returns what the run printed.
std::string resume_past_damage(Config config) {
  config.training.total_steps = 6;
  config.logging.level = dspine::core::LogLevel::kWarn;
  ::testing::internal::CaptureStdout();
  const auto result = train(config);
  const std::string printed = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(result.first_step, 2);
  EXPECT_EQ(result.final_step, 6);
  return printed;
}

// Flips a byte of `directory`'s model.safetensors; returns what a refusal must name: the file,
// its SHA-256 as now measured and the one its manifest (`manifest`) records.
std::vector<std::string> corrupt_weights(const fs::path& directory, const std::string& manifest) {
  const fs::path weights = directory / "model.safetensors";
  flip_byte(weights, 100);
  std::ifstream in(directory / manifest);
  const auto recorded = nlohmann::json::parse(in)["files"]["model.safetensors"]["sha256"];
  return {weights.string() + " is corrupt", "its SHA-256 is " +
          dspine::core::digest_file(weights.string()).sha256,
          "the manifest records " + recorded.get<std::string>()};
}

// The step-* directories under `dir`.
std::vector<fs::path> saved_steps(const fs::path& dir) {
  std::vector<fs::path> steps;
  if (!fs::is_directory(dir)) return steps;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind("step-", 0) == 0) steps.push_back(entry.path());
  }
  return steps;
}

// One saved step of the tiny DSpine configuration on the CPU (what an export reads).
std::string tiny_dspine_checkpoint(const fs::path& dir) {
  auto config = dspine::testing::tiny_dspine_run_config(dir, 1);
  config.training.device = dspine::core::Device::kCpu;
  return train(config).last_checkpoint;
}

}  // namespace

TEST(CheckpointIntegrity, ManifestRecordsSizeAndChecksumOfEveryFile) {
  const auto config = two_checkpoints(fresh_dir("manifest"));
  std::ifstream in(checkpoint(config, 4) / "trainer_state.json");
  const auto manifest = nlohmann::json::parse(in);
  for (const std::string& name : std::vector<std::string>{"model.safetensors", "config.json",
                                   "rng.safetensors", dspine::train::optimizer_shard_name(0, 1)}) {
    ASSERT_TRUE(manifest["files"].contains(name)) << name;
    EXPECT_EQ(manifest["files"][name]["bytes"].get<int64_t>(),
              static_cast<int64_t>(fs::file_size(checkpoint(config, 4) / name)));
    EXPECT_EQ(manifest["files"][name]["sha256"].get<std::string>().size(), 64u);
  }
}

TEST(CheckpointIntegrity, ChecksumMismatchNamesTheFile) {
  const auto config = two_checkpoints(fresh_dir("mismatch"));
  const std::string shard = dspine::train::optimizer_shard_name(0, 1);
  flip_byte(checkpoint(config, 4) / shard, 200);
  expect_error_mentioning([&] { dspine::train::load_checkpoint(checkpoint(config, 4).string()); },
                          {shard, "SHA-256"});
}

TEST(CheckpointIntegrity, AutoResumeSkipsTruncatedNewestCheckpoint) {
  const auto config = two_checkpoints(fresh_dir("truncated"));
  const auto model = checkpoint(config, 4) / "model.safetensors";
  fs::resize_file(model, fs::file_size(model) / 2);
  const std::string printed = resume_past_damage(config);
  EXPECT_NE(printed.find("skipping checkpoint"), std::string::npos) << printed;
  EXPECT_NE(printed.find("model.safetensors"), std::string::npos) << printed;
  // Set aside under a name "auto" never takes, and the run saved a good step 4 again.
  ASSERT_EQ(entries_starting(config, ".invalid-step-000004-").size(), 1u);
  EXPECT_NO_THROW(dspine::train::verify_checkpoint(checkpoint(config, 4).string()));
}

TEST(CheckpointIntegrity, AutoResumeSkipsCorruptNewestCheckpoint) {
  const auto config = two_checkpoints(fresh_dir("corrupt"));
  flip_byte(checkpoint(config, 4) / "model.safetensors", 100);
  const std::string printed = resume_past_damage(config);
  EXPECT_NE(printed.find("is corrupt"), std::string::npos) << printed;
  EXPECT_EQ(entries_starting(config, ".invalid-step-000004-").size(), 1u);
}

TEST(CheckpointIntegrity, AutoResumeSkipsBadManifest) {
  const auto config = two_checkpoints(fresh_dir("manifest_bad"));
  std::ofstream(checkpoint(config, 4) / "trainer_state.json") << "{\"step\": 4";
  resume_past_damage(config);
  EXPECT_EQ(entries_starting(config, ".invalid-step-000004-").size(), 1u);
}

TEST(CheckpointIntegrity, ResumingAnOlderCheckpointSetsNewerOnesAside) {
  auto config = two_checkpoints(fresh_dir("older"));
  config.checkpoint.resume = checkpoint(config, 2).string();
  config.training.total_steps = 6;
  ::testing::internal::CaptureStdout();
  const auto result = train(config);
  const std::string printed = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(result.first_step, 2);
  EXPECT_EQ(result.final_step, 6);  // saved steps 4 and 6 without a collision
  EXPECT_NE(printed.find("step-000004"), std::string::npos) << printed;
  EXPECT_EQ(entries_starting(config, ".superseded-step-000004-").size(), 1u);
  EXPECT_NO_THROW(dspine::train::verify_checkpoint(checkpoint(config, 6).string()));
}

TEST(CheckpointIntegrity, ConfigChangesListEveryDifferingKey) {
  auto saved = dspine::testing::small_run_config(fresh_dir("diff"), 4);
  auto now = saved;
  now.training.learning_rate = 1e-4;
  now.checkpoint.resume = "auto";  // how to start is not a change
  const auto changes = dspine::train::config_changes(saved, now);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].key, "training.learning_rate");
  EXPECT_EQ(changes[0].now, "0.0001");
}

TEST(CheckpointIntegrity, ResumeRefusesShapeAndDataChangesNamingThem) {
  auto config = two_checkpoints(fresh_dir("refused"));
  config.training.total_steps = 6;
  config.model.intermediate_size = 128;
  config.training.seed = 7;
  expect_error_mentioning([&] { train(config); },
                          {"cannot resume", "model.intermediate_size: 64 -> 128",
                           "training.seed: 42 -> 7"});
}

TEST(CheckpointIntegrity, ResumeWarnsAboutOtherChanges) {
  auto config = two_checkpoints(fresh_dir("allowed"));
  config.training.total_steps = 6;
  config.training.learning_rate = 5e-4;
  ::testing::internal::CaptureStdout();
  const auto result = train(config);
  const std::string printed = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(result.final_step, 6);
  EXPECT_NE(printed.find("training.total_steps: 4 -> 6"), std::string::npos) << printed;
  EXPECT_NE(printed.find("training.learning_rate:"), std::string::npos) << printed;
}

// A save that runs out of space (RLIMIT_FSIZE makes write() fail with EFBIG, SIGXFSZ ignored)
// fails naming the directory and the reason, removes its temporary directory and leaves the
// checkpoints already saved intact.
TEST(CheckpointIntegrity, FullDiskKeepsTheLastGoodCheckpoint) {
  const auto config = two_checkpoints(fresh_dir("full_disk"));
  auto comm = dspine::dist::make_single_process_communicator();
  dspine::train::CheckpointManager manager(config.checkpoint.dir, 2, *comm);
  const auto loaded = dspine::train::load_checkpoint(checkpoint(config, 4).string());
  const dspine::train::CheckpointContents contents{loaded.model.tensors, loaded.model_config,
                                                   loaded.optimizer.at(0).tensors,
                                                   loaded.rng.tensors, loaded.trainer_state};
  const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit tiny = saved;
  tiny.rlim_cur = 256;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &tiny), 0);
  std::string message;
  try {
    manager.save(6, contents);
  } catch (const dspine::Error& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous_handler);
  EXPECT_NE(message.find(config.checkpoint.dir), std::string::npos) << message;
  EXPECT_NE(message.find("File too large"), std::string::npos) << message;
  EXPECT_TRUE(entries_starting(config, ".tmp-").empty());
  EXPECT_EQ(manager.latest(), checkpoint(config, 4).string());
  EXPECT_NO_THROW(dspine::train::verify_checkpoint(checkpoint(config, 4).string()));
  EXPECT_NO_THROW(dspine::train::verify_checkpoint(checkpoint(config, 2).string()));
}

// Tests run as root, which ignores permissions: a checkpoint.dir below a regular file stands
// for a directory the run cannot write.
TEST(CheckpointIntegrity, UnwritableDirectoryIsNamedWithTheReason) {
  const auto dir = fresh_dir("unwritable");
  std::ofstream(dir / "file") << "not a directory";
  auto config = dspine::testing::small_run_config(dir, 2);
  config.checkpoint.dir = (dir / "file" / "checkpoints").string();
  config.checkpoint.save_every = 2;
  expect_error_mentioning([&] { train(config); },
                          {"cannot save checkpoint step-000002", config.checkpoint.dir,
                           "Not a directory"});
}

// training.init_from (and GSPO's alias, which the trainer loads the same way) verifies the
// checkpoint as a resume does, before the weights are read: a corrupt model.safetensors, named
// as a directory or as the file itself, stops the run before it writes anything.
TEST(CheckpointIntegrity, InitFromRefusesACorruptCheckpoint) {
  const auto dir = fresh_dir("init_from_corrupt");
  auto config = two_checkpoints(dir);
  const auto source = checkpoint(config, 4);
  const auto refusal = corrupt_weights(source, "trainer_state.json");
  config.checkpoint.dir = (dir / "fine_tune").string();
  config.checkpoint.resume = "none";
  config.checkpoint.save_every = 1;
  for (const fs::path& init_from : {source, source / "model.safetensors"}) {
    config.training.init_from = init_from.string();
    expect_error_mentioning([&] { train(config); }, refusal);
    EXPECT_TRUE(saved_steps(config.checkpoint.dir).empty()) << init_from;
  }
}

// GSPO's objective.gspo.init_from names the weights through the objective; the trainer verifies
// them all the same.
TEST(CheckpointIntegrity, GspoInitFromRefusesACorruptCheckpoint) {
  const auto dir = fresh_dir("gspo_init_from_corrupt");
  const fs::path source = tiny_dspine_checkpoint(dir / "sft");
  const auto refusal = corrupt_weights(source, "trainer_state.json");
  auto config = dspine::testing::tiny_dspine_run_config(dir / "rl", 1);
  config.training.device = dspine::core::Device::kCpu;
  config.objective.name = "gspo";
  dspine::objectives::GspoSettings gspo;
  gspo.rollout.group_size = 3;
  gspo.init_from = source.string();
  config.set_section("objective.gspo", gspo);
  expect_error_mentioning([&] { train(config); }, refusal);
  EXPECT_TRUE(saved_steps(config.checkpoint.dir).empty());
}

// dspine-data export verifies the files it reads and writes its own manifest (kExportManifest),
// which every later load of the export checks the same way.
TEST(CheckpointIntegrity, ExportRefusesACorruptCheckpointAndRecordsItsOwnDigests) {
  const auto dir = fresh_dir("export_corrupt");
  const fs::path source = tiny_dspine_checkpoint(dir / "run");
  const auto good = dir / "good";
  dspine::train::export_draft(source.string(), good.string());
  std::ifstream in(good / dspine::train::kExportManifest);
  const auto manifest = nlohmann::json::parse(in);
  for (const char* name : {"model.safetensors", "config.json"}) {
    const auto digest = dspine::core::digest_file((good / name).string());
    EXPECT_EQ(manifest["files"][name]["sha256"], digest.sha256) << name;
    EXPECT_EQ(manifest["files"][name]["bytes"], digest.bytes) << name;
  }
  EXPECT_NO_THROW(dspine::train::verify_weights(good.string()));

  const auto refusal = corrupt_weights(source, "trainer_state.json");
  expect_error_mentioning(
      [&] { dspine::train::export_draft(source.string(), (dir / "bad").string()); }, refusal);
  EXPECT_FALSE(fs::exists(dir / "bad"));

  // A corrupt export: refused by the loads (verify_weights) and by a re-export alike.
  const auto export_refusal = corrupt_weights(good, dspine::train::kExportManifest);
  expect_error_mentioning([&] { dspine::train::verify_weights(good.string()); }, export_refusal);
  expect_error_mentioning(
      [&] { dspine::train::export_draft(good.string(), (dir / "again").string()); },
      export_refusal);
  EXPECT_FALSE(fs::exists(dir / "again"));
}
