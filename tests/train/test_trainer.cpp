// Trainer behaviour on CPU: loss falls, resume is exact, checkpoints are kept safely.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/dspine_tiny.h"
#include "core/checksum.h"
#include "core/config.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "data/batch_source.h"
#include "dist/communicator.h"
#include "objectives/dspine_objective.h"
#include "objectives/dspine_settings.h"
#include "objectives/gspo_objective.h"
#include "objectives/objective.h"
#include "train/checkpoint.h"
#include "train/lr_schedule.h"
#include "common/nonfinite.h"
#include "common/fresh_dir.h"
#include "common/small_run.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using dspine::core::Config;

namespace {

using dspine::testing::fresh_dir;

Config small_config(const fs::path& dir, int64_t total_steps) {
  return dspine::testing::small_run_config(dir, total_steps);
}

Config tiny_dspine_config(const fs::path& dir, int64_t total_steps) {
  return dspine::testing::tiny_dspine_run_config(dir, total_steps);
}

std::map<std::string, torch::Tensor> parameters_of(torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : module.named_parameters()) out[item.key()] = item.value().clone();
  return out;
}

}  // namespace

TEST(LrSchedule, WarmsUpLinearlyThenAnnealsToZero) {
  dspine::train::LrSchedule schedule(1.0, 100, 0.1, dspine::core::LrScheduler::kCosine);
  EXPECT_EQ(schedule.warmup_steps(), 10);
  EXPECT_DOUBLE_EQ(schedule.at(0), 0.1);
  EXPECT_DOUBLE_EQ(schedule.at(9), 1.0);
  EXPECT_DOUBLE_EQ(schedule.at(10), 1.0);  // first post-warmup step keeps the base rate
  EXPECT_NEAR(schedule.at(55), 0.5, 1e-12);
  EXPECT_NEAR(schedule.at(100), 0.0, 1e-12);
  dspine::train::LrSchedule constant(2.0, 10, 0.0, dspine::core::LrScheduler::kConstant);
  EXPECT_DOUBLE_EQ(constant.at(7), 2.0);
}

TEST(Trainer, ShortRunLossFalls) {
  auto dir = fresh_dir("loss_falls");
  auto config = small_config(dir, 60);
  config.training.learning_rate = 3e-3;
  dspine::train::Trainer trainer(config, dspine::dist::make_single_process_communicator());
  auto result = trainer.run();
  ASSERT_EQ(result.losses.size(), 60u);
  double first = 0, last = 0;
  for (int i = 0; i < 10; ++i) first += result.losses[i] / 10;
  for (int i = 50; i < 60; ++i) last += result.losses[i] / 10;
  EXPECT_LT(last, 0.8 * first) << "first " << first << " last " << last;
  // The metrics file has one JSON record per logging.every steps with the documented keys.
  std::ifstream metrics(config.logging.metrics_file);
  std::string line;
  int lines = 0;
  while (std::getline(metrics, line)) {
    ++lines;
    for (const char* key : {"\"step\"", "\"loss\"", "\"lr\"", "\"grad_norm\"", "\"tokens_per_s\"",
                            "\"memory_bytes\"", "\"ce\"", "\"accuracy\""}) {
      EXPECT_NE(line.find(key), std::string::npos) << key << " missing in " << line;
    }
  }
  EXPECT_EQ(lines, 60 / config.logging.every);
}

TEST(Trainer, ResumeMatchesUninterruptedRunBitwise) {
  auto dir = fresh_dir("resume");
  constexpr int64_t kSteps = 6;
  auto interrupted = small_config(dir / "a", 2 * kSteps);
  interrupted.training.dtype = dspine::core::Dtype::kFp32;
  {
    dspine::train::Trainer first(interrupted, dspine::dist::make_single_process_communicator());
    auto part = first.run(kSteps);
    EXPECT_EQ(part.final_step, kSteps);
    EXPECT_TRUE(fs::exists(fs::path(interrupted.checkpoint.dir) / "step-000006"));
  }
  interrupted.checkpoint.resume = "auto";
  dspine::train::Trainer second(interrupted, dspine::dist::make_single_process_communicator());
  auto rest = second.run();
  EXPECT_EQ(rest.first_step, kSteps);

  auto straight = small_config(dir / "b", 2 * kSteps);
  dspine::train::Trainer reference(straight, dspine::dist::make_single_process_communicator());
  auto full = reference.run();
  ASSERT_EQ(full.losses.size(), static_cast<size_t>(2 * kSteps));
  ASSERT_EQ(rest.losses.size(), static_cast<size_t>(kSteps));
  for (int64_t i = 0; i < kSteps; ++i) {
    EXPECT_EQ(rest.losses[i], full.losses[kSteps + i]) << "step " << kSteps + i;
  }
  auto resumed = parameters_of(second.module());
  auto expected = parameters_of(reference.module());
  ASSERT_EQ(resumed.size(), expected.size());
  for (const auto& [name, tensor] : expected) {
    EXPECT_TRUE(torch::equal(resumed.at(name), tensor)) << name;
  }
}

TEST(Trainer, KeepLastKeepsOnlyTheNewestCheckpoints) {
  auto dir = fresh_dir("keep_last");
  auto config = small_config(dir, 5);
  config.checkpoint.save_every = 1;
  config.checkpoint.keep_last = 2;
  dspine::train::Trainer trainer(config, dspine::dist::make_single_process_communicator());
  trainer.run();
  auto comm = dspine::dist::make_single_process_communicator();
  dspine::train::CheckpointManager manager(config.checkpoint.dir, 2, *comm);
  auto kept = manager.list();
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(fs::path(kept[0]).filename(), "step-000004");
  EXPECT_EQ(fs::path(kept[1]).filename(), "step-000005");
}

TEST(Trainer, RefusesToStartFreshOverSavedCheckpoints) {
  auto dir = fresh_dir("no_overwrite");
  auto config = small_config(dir, 2);
  dspine::train::Trainer(config, dspine::dist::make_single_process_communicator()).run();
  dspine::train::Trainer again(config, dspine::dist::make_single_process_communicator());
  try {
    again.run();
    FAIL() << "expected an error";
  } catch (const dspine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint.resume: auto"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::exists(fs::path(config.checkpoint.dir) / "step-000002"));
}

TEST(Checkpoint, InterruptedSaveLeavesPreviousCheckpointUsable) {
  auto dir = fresh_dir("interrupted");
  auto config = small_config(dir, 3);
  config.checkpoint.save_every = 3;
  dspine::train::Trainer(config, dspine::dist::make_single_process_communicator()).run();
  const auto previous = fs::path(config.checkpoint.dir) / "step-000003";
  ASSERT_TRUE(fs::exists(previous));

  // A save that dies after writing its weights (as a killed job would).
  auto comm = dspine::dist::make_single_process_communicator();
  dspine::train::CheckpointManager manager(config.checkpoint.dir, 1, *comm);
  auto loaded = dspine::train::load_checkpoint(previous.string());
  dspine::train::CheckpointContents contents{loaded.model.tensors, loaded.model_config,
                                             loaded.optimizer.at(0).tensors, loaded.rng.tensors,
                                             loaded.trainer_state};
  EXPECT_THROW(manager.save(4, contents,
                            [](const std::string& file) {
                              if (file == "config.json") throw std::runtime_error("killed");
                            }),
               std::runtime_error);
  EXPECT_EQ(manager.latest(), previous.string());
  EXPECT_NO_THROW(dspine::train::load_checkpoint(manager.latest()));

  // Resuming uses the previous checkpoint, cleans the leftovers and trains on.
  config.checkpoint.resume = "auto";
  config.training.total_steps = 5;
  dspine::train::Trainer resumed(config, dspine::dist::make_single_process_communicator());
  auto result = resumed.run();
  EXPECT_EQ(result.first_step, 3);
  EXPECT_EQ(result.final_step, 5);
  for (const auto& entry : fs::directory_iterator(config.checkpoint.dir)) {
    EXPECT_NE(entry.path().filename().string().rfind(".tmp-", 0), 0u) << entry.path();
  }
}

TEST(Checkpoint, MissingFileIsNamedInTheError) {
  auto dir = fresh_dir("missing_file");
  auto config = small_config(dir, 1);
  dspine::train::Trainer(config, dspine::dist::make_single_process_communicator()).run();
  const auto checkpoint = fs::path(config.checkpoint.dir) / "step-000001";
  const std::string shard = dspine::train::optimizer_shard_name(0, 1);
  fs::remove(checkpoint / shard);
  try {
    dspine::train::load_checkpoint(checkpoint.string());
    FAIL() << "expected an error";
  } catch (const dspine::Error& e) {
    EXPECT_NE(std::string(e.what()).find(shard), std::string::npos) << e.what();
  }
}

TEST(Trainer, Bf16RunTrainsBf16ParametersFromFp32Masters) {
  auto dir = fresh_dir("bf16");
  auto config = small_config(dir, 4);
  config.training.dtype = dspine::core::Dtype::kBf16;
  dspine::train::Trainer trainer(config, dspine::dist::make_single_process_communicator());
  auto before = parameters_of(trainer.module());
  auto result = trainer.run();
  for (double loss : result.losses) EXPECT_TRUE(std::isfinite(loss));
  bool changed = false;
  for (const auto& item : trainer.module().named_parameters()) {
    EXPECT_EQ(item.value().scalar_type(), torch::kBFloat16) << item.key();
    changed |= !torch::equal(item.value(), before.at(item.key()));
  }
  EXPECT_TRUE(changed);
  // The optimizer state keeps fp32 masters beside the bf16 weights.
  auto saved = dspine::train::load_checkpoint(result.last_checkpoint);
  EXPECT_EQ(saved.optimizer.at(0).at("master.context").scalar_type(), torch::kFloat);
  EXPECT_EQ(saved.model.at("fc.weight").scalar_type(), torch::kBFloat16);
}

TEST(Trainer, DSpineTransferCodesComeFromTheCheckpointOnResume) {
  auto dir = fresh_dir("dspine_codes");
  Config config = tiny_dspine_config(dir, 2);
  config.data.seq_len = 24;
  dspine::train::Trainer first(config, dspine::dist::make_single_process_communicator());
  auto saved = first.run();

  // Flip the sign of the saved codes (still a valid basis): a resume must load them, not
  // recompute them from the lm_head.
  auto model_file = (fs::path(saved.last_checkpoint) / "model.safetensors").string();
  auto weights = dspine::core::load_safetensors(model_file);
  torch::Tensor flipped;
  for (auto& [name, tensor] : weights.tensors) {
    if (name == "transfer_codes") tensor = flipped = -tensor;
  }
  ASSERT_TRUE(flipped.defined());
  dspine::core::save_safetensors(model_file, weights.tensors, weights.metadata);
  // An edit on purpose: the manifest records the file's new size and checksum, as a save would.
  const auto manifest_file = fs::path(saved.last_checkpoint) / "trainer_state.json";
  std::ifstream manifest_in(manifest_file);
  auto manifest = nlohmann::json::parse(manifest_in);
  const auto digest = dspine::core::digest_file(model_file);
  manifest["files"]["model.safetensors"] = {{"bytes", digest.bytes}, {"sha256", digest.sha256}};
  std::ofstream(manifest_file) << manifest.dump(2);

  config.checkpoint.resume = "auto";
  config.training.total_steps = 3;
  dspine::train::Trainer resumed(config, dspine::dist::make_single_process_communicator());
  resumed.run();
  auto buffers = resumed.module().named_buffers();
  EXPECT_TRUE(torch::equal(buffers["transfer_codes"].cpu(), flipped));  // any training device
  EXPECT_EQ(buffers["transfer_codes"].scalar_type(), torch::kFloat);
  EXPECT_TRUE(buffers["transfer_ready"].item<bool>());
}

// The fresh-start initialisation the objective does on the model (DSpine's readouts from the
// transfer space) is what the optimizer's fp32 masters start from: a step at a negligible rate
// leaves it in place instead of writing the pre-initialisation weights back.
// The phase hook sees every window's phases in order; DSpine announces its replay's forward,
// objective and backward once per micro-batch (the CE objective announces none), and the
// evaluation after the last step announces nothing.
TEST(Trainer, PhaseHookSeesTheReplaySubPhasesPerMicroBatch) {
  auto collect = [](Config config) {
    config.training.device = dspine::core::Device::kCpu;
    dspine::train::Trainer trainer(config, dspine::dist::make_single_process_communicator());
    std::vector<std::string> phases;
    trainer.set_phase_hook([&](const std::string& phase) { phases.push_back(phase); });
    trainer.run();
    return phases;
  };
  auto dir = fresh_dir("phase_hook");
  Config dspine = tiny_dspine_config(dir, 1);  // accumulation 2, evaluation at the last step
  ASSERT_EQ(dspine.training.accumulation_steps, 2);
  ASSERT_GT(dspine.training.eval_every, 0);
  const std::vector<std::string> expected = {
      "data",     "prepass",   "replay",   "forward",   "objective", "backward",
      "forward",  "objective", "backward", "optimizer", "end"};
  EXPECT_EQ(collect(dspine), expected);
  const std::vector<std::string> plain = {"data", "prepass", "replay", "optimizer", "end"};
  EXPECT_EQ(collect(small_config(fresh_dir("phase_hook_ce"), 1)), plain);
}

// The recipe's objective.dspine.prepass: keep_last trains the run of the reference's scheme (all):
// the same losses step by step; its kept micro-batch announces no forward of its own.
TEST(Trainer, KeptLastPrepassTrainsTheSameRun) {
  auto dir = fresh_dir("keep_last_prepass");
  auto train = [&](const std::string& prepass, std::vector<std::string>* phases) {
    auto config = dspine::testing::tiny_dspine_run_config(dir / prepass, 3,
                                                          {"objective.dspine.prepass=" + prepass});
    dspine::train::Trainer trainer(config, dspine::dist::make_single_process_communicator());
    trainer.set_phase_hook([&](const std::string& phase) { phases->push_back(phase); });
    return trainer.run().losses;
  };
  std::vector<std::string> phases_all, phases_kept;
  const auto all = train("all", &phases_all);
  const auto kept = train("keep_last", &phases_kept);
  ASSERT_EQ(kept.size(), all.size());
  ASSERT_EQ(all.size(), 3u);
  for (size_t i = 0; i < all.size(); ++i) {
    // CE̅ comes from another row pass (the kept terms against the CE-only one): rounding apart.
    EXPECT_NEAR(kept[i], all[i], 1e-5 * std::max(1.0, std::abs(all[i]))) << "step " << i + 1;
  }
  const std::vector<std::string> window = {"data",      "prepass",   "replay",
                                           "forward",   "objective", "backward",
                                           "objective", "backward",  "optimizer"};
  ASSERT_GE(phases_kept.size(), window.size());
  EXPECT_EQ(std::vector<std::string>(phases_kept.begin(), phases_kept.begin() + window.size()),
            window);
  EXPECT_EQ(std::count(phases_kept.begin(), phases_kept.end(), "forward") + 3,
            std::count(phases_all.begin(), phases_all.end(), "forward"));
}

TEST(Trainer, FreshStartInitialisationReachesTheMasters) {
  auto dir = fresh_dir("fresh_start");
  Config config = tiny_dspine_config(dir, 1);
  config.training.learning_rate = 1e-12;
  config.training.device = dspine::core::Device::kCpu;
  dspine::train::Trainer trainer(config, dspine::dist::make_single_process_communicator());
  trainer.run();

  torch::manual_seed(static_cast<uint64_t>(config.training.seed));  // as the trainer builds it
  auto source = dspine::data::make_batch_source(config, torch::kCPU);
  auto initialised = dspine::objectives::make_dspine_objective(
      dspine::testing::draft_config(config),
      config.section<dspine::objectives::DSpineSettings>("objective.dspine"),
      config.training.accumulation_steps, source->embed_tokens(), source->lm_head(), torch::kCPU,
      torch::kFloat);
  const std::string readout = "injection.readouts.0.weight";
  const auto random_init = initialised->module()->named_parameters()[readout].clone();
  initialised->on_fresh_start("");
  const auto expected = initialised->module()->named_parameters()[readout];
  const auto trained = trainer.module().named_parameters()[readout];
  ASSERT_FALSE(torch::allclose(random_init, expected, 1e-3, 1e-3));
  EXPECT_TRUE(torch::allclose(trained, expected, 1e-5, 1e-6))
      << "max diff " << (trained - expected).abs().max().item<double>();
}

namespace {

// GSPO from a tiny supervised checkpoint: expected_acceptance rewards (a barely trained draft
// still ranks its samples), two updates per rollout.
Config tiny_gspo_config(const fs::path& dir, int64_t total_steps, const std::string& init_from) {
  Config config = tiny_dspine_config(dir, total_steps);
  config.objective.name = "gspo";
  dspine::objectives::GspoSettings gspo;
  gspo.rollout.group_size = 3;
  gspo.rollout.reward = dspine::objectives::GspoReward::kExpectedAcceptance;
  gspo.updates_per_rollout = 2;
  gspo.eps_low = 0.2;
  gspo.eps_high = 0.2;
  gspo.init_from = init_from;
  config.set_section("objective.gspo", gspo);
  return config;
}

// A two-step supervised tiny DSpine run; returns its final checkpoint.
std::string supervised_checkpoint(const fs::path& dir) {
  Config config = tiny_dspine_config(dir, 2);
  dspine::train::Trainer trainer(config, dspine::dist::make_single_process_communicator());
  return trainer.run().last_checkpoint;
}

}  // namespace

TEST(Trainer, GspoStartsFromTheSupervisedCheckpoint) {
  auto dir = fresh_dir("gspo_init");
  const std::string checkpoint = supervised_checkpoint(dir / "sft");
  dspine::train::Trainer rl(tiny_gspo_config(dir / "rl", 1, checkpoint),
                            dspine::dist::make_single_process_communicator());
  rl.run(0);  // start-up only: loads init_from, takes no step
  const auto saved = dspine::core::load_safetensors((fs::path(checkpoint) / "model.safetensors").string());
  size_t compared = 0;
  // The module lives on the training device (the GPU where there is one), the file's on the CPU.
  for (const auto& item : rl.module().named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value().cpu(), saved.at(item.key()))) << item.key();
    ++compared;
  }
  for (const auto& item : rl.module().named_buffers()) {
    EXPECT_TRUE(torch::equal(item.value().cpu(), saved.at(item.key()))) << item.key();
  }
  EXPECT_GT(compared, 0u);

  auto missing = tiny_gspo_config(dir / "rl2", 1, (dir / "nowhere").string());
  try {
    dspine::train::Trainer bad(missing, dspine::dist::make_single_process_communicator());
    bad.run();
    FAIL() << "a missing init_from must be an error";
  } catch (const dspine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("nowhere"), std::string::npos) << e.what();
  }
}

TEST(Trainer, GspoResumeMatchesUninterruptedRunBitwise) {
  auto dir = fresh_dir("gspo_resume");
  const std::string checkpoint = supervised_checkpoint(dir / "sft");
  constexpr int64_t kSteps = 2;
  auto interrupted = tiny_gspo_config(dir / "a", 2 * kSteps, checkpoint);
  std::vector<std::map<std::string, double>> first_terms;
  {
    dspine::train::Trainer first(interrupted, dspine::dist::make_single_process_communicator());
    first_terms = first.run(kSteps).terms;
  }
  interrupted.checkpoint.resume = "auto";
  dspine::train::Trainer second(interrupted, dspine::dist::make_single_process_communicator());
  auto rest = second.run();
  ASSERT_EQ(rest.first_step, kSteps);

  dspine::train::Trainer reference(tiny_gspo_config(dir / "b", 2 * kSteps, checkpoint),
                                   dspine::dist::make_single_process_communicator());
  auto full = reference.run();
  ASSERT_EQ(full.losses.size(), static_cast<size_t>(2 * kSteps));
  for (int64_t i = 0; i < kSteps; ++i) {
    EXPECT_EQ(rest.losses[i], full.losses[kSteps + i]) << "step " << kSteps + i;
    EXPECT_EQ(rest.terms[i].at("gspo/reward"), full.terms[kSteps + i].at("gspo/reward"));
  }
  auto resumed = parameters_of(second.module());
  for (const auto& [name, tensor] : parameters_of(reference.module())) {
    EXPECT_TRUE(torch::equal(resumed.at(name), tensor)) << name;
  }
  // The RL metrics of every step, and a second update that saw a moved policy.
  for (const auto& terms : full.terms) {
    for (const char* key : {"gspo/reward", "gspo/accepted_length", "gspo/clipped_fraction",
                            "gspo/ratio_mean", "gspo/new_logprobs", "gspo/kl", "time/seam_s",
                            "time/seam_share"}) {
      EXPECT_TRUE(terms.count(key)) << key;
    }
  }
  EXPECT_GT(full.terms.back().at("gspo/kl"), 0.0);
}

// training.on_nonfinite: skip. A NaN in one micro-batch makes its step's loss and gradient NaN:
// that update is not applied (the weights stay as they were), it is counted, training goes on.
// The anchors and replacement masks are keyed by (seed, step, global row): a resume restores no
// generator state. A checkpoint written before that (rng.safetensors holding the per-rank
// generator state objective_generator.rank0) still loads, its state unused, and the resumed run
// equals the uninterrupted one bitwise; new checkpoints record only the seed.
TEST(Trainer, DSpineResumeFromAnOlderRngFileIsBitwise) {
  auto dir = fresh_dir("dspine_old_rng");
  constexpr int64_t kSteps = 2;
  auto quick = [&](const fs::path& run) {
    Config config = tiny_dspine_config(run, 2 * kSteps);
    config.training.eval_every = 0;
    config.data.seq_len = 32;
    return config;  // on the GPU where there is one: training.deterministic makes it bitwise

  };
  const auto saved = dspine::train::Trainer(quick(dir / "a"),
                                            dspine::dist::make_single_process_communicator())
                         .run(kSteps)
                         .last_checkpoint;
  auto loaded = dspine::train::load_checkpoint(saved);
  ASSERT_EQ(loaded.rng.tensors.size(), 1u);
  EXPECT_EQ(loaded.rng.tensors.at(0).first, "row_streams.seed");
  EXPECT_EQ(loaded.rng.tensors.at(0).second.item<int64_t>(), quick(dir).training.seed);
  // The same checkpoint as an older version wrote it: a CPU generator state per rank.
  auto comm = dspine::dist::make_single_process_communicator();
  Config old = quick(dir / "old");
  dspine::train::CheckpointManager(old.checkpoint.dir, 2, *comm)
      .save(kSteps, {loaded.model.tensors, loaded.model_config, loaded.optimizer.at(0).tensors,
                     {{"objective_generator.rank0", torch::zeros({5056}, torch::kUInt8)}},
                     loaded.trainer_state});
  old.checkpoint.resume = "auto";
  dspine::train::Trainer resumed(old, dspine::dist::make_single_process_communicator());
  const auto rest = resumed.run();
  ASSERT_EQ(rest.first_step, kSteps);

  dspine::train::Trainer reference(quick(dir / "b"),
                                   dspine::dist::make_single_process_communicator());
  const auto full = reference.run();
  ASSERT_EQ(rest.losses.size(), static_cast<size_t>(kSteps));
  for (int64_t i = 0; i < kSteps; ++i) {
    EXPECT_EQ(rest.losses[i], full.losses[kSteps + i]) << "step " << kSteps + i;
  }
  auto got = parameters_of(resumed.module());
  for (const auto& [name, tensor] : parameters_of(reference.module())) {
    EXPECT_TRUE(torch::equal(got.at(name), tensor)) << name;
  }
}

TEST(Trainer, NonFiniteStepIsSkippedAndTrainingContinues) {
  auto dir = fresh_dir("nonfinite_skip");
  auto config = small_config(dir, 5);
  config.logging.every = 1;
  dspine::train::Trainer trainer(config, dspine::dist::make_single_process_communicator());
  trainer.set_batch_hook(dspine::testing::nan_at(2, 1));
  dspine::testing::StepRecorder steps(trainer);
  const auto result = trainer.run();
  EXPECT_EQ(result.final_step, 5);
  EXPECT_EQ(result.nonfinite_skipped, 1);
  EXPECT_EQ(steps.changed, (std::vector<bool>{true, true, false, true, true}));
  for (size_t i = 0; i < result.losses.size(); ++i) {
    EXPECT_EQ(std::isfinite(result.losses[i]), i != 2) << "step " << i;
  }
  // Every weight stays finite, and the metrics count the skipped step from then on.
  for (const auto& [name, tensor] : dspine::testing::weights_of(trainer.module())) {
    EXPECT_TRUE(torch::isfinite(tensor).all().item<bool>()) << name;
  }
  std::ifstream metrics(config.logging.metrics_file);
  std::string line;
  for (int step = 1; std::getline(metrics, line); ++step) {
    const std::string expected = step > 2 ? "\"nonfinite_skipped\":1" : "\"nonfinite_skipped\":0";
    EXPECT_NE(line.find(expected), std::string::npos) << line;
  }
}

// An objective that finds its window untrainable in begin_window (a GSPO rollout that drew outside
// the vocabulary) throws WindowFailure on every rank: the run saves the state before that step and
// stops with the objective's message and the checkpoint; resuming starts from exactly that state.
TEST(Trainer, WindowFailureStopsAfterSavingTheStateBeforeIt) {
  auto dir = fresh_dir("window_failure");
  auto config = small_config(dir, 5);
  dspine::train::Trainer trainer(config, dspine::dist::make_single_process_communicator());
  std::vector<std::map<std::string, torch::Tensor>> before;  // weights at each step's start
  trainer.set_phase_hook([&](const std::string& phase) {
    if (phase != "prepass") return;
    before.push_back(dspine::testing::weights_of(trainer.module()));
    if (before.size() == 3) throw dspine::objectives::WindowFailure("the rollout drew token id 4096");
  });
  try {
    trainer.run();
    FAIL() << "a window failure did not stop the run";
  } catch (const dspine::Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("step 3: the rollout drew token id 4096; the state before this step "
                           "is saved in"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("step-000002"), std::string::npos) << message;
  }
  ASSERT_EQ(before.size(), 3u);
  config.checkpoint.resume = "auto";
  dspine::train::Trainer resumed(config, dspine::dist::make_single_process_communicator());
  const auto again = resumed.run(/*stop_after=*/0);
  EXPECT_EQ(again.first_step, 2);
  EXPECT_TRUE(
      dspine::testing::same_weights(before[2], dspine::testing::weights_of(resumed.module())));
}

// training.on_nonfinite: stop. The run saves the state before the bad step and ends with an
// error naming the setting and the checkpoint; resuming it starts from exactly that state.
TEST(Trainer, NonFiniteStepStopsAfterSavingTheStateBeforeIt) {
  auto dir = fresh_dir("nonfinite_stop");
  auto config = small_config(dir, 5);
  config.training.on_nonfinite = dspine::core::OnNonfinite::kStop;
  dspine::train::Trainer trainer(config, dspine::dist::make_single_process_communicator());
  trainer.set_batch_hook(dspine::testing::nan_at(2, 0));
  dspine::testing::StepRecorder steps(trainer);
  try {
    trainer.run();
    FAIL() << "a non-finite step did not stop the run";
  } catch (const dspine::Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("step 3: the loss or gradient is not finite"), std::string::npos)
        << message;
    EXPECT_NE(message.find("training.on_nonfinite: stop"), std::string::npos) << message;
    EXPECT_NE(message.find("step-000002"), std::string::npos) << message;
  }
  ASSERT_EQ(steps.before.size(), 3u);
  config.checkpoint.resume = "auto";
  dspine::train::Trainer resumed(config, dspine::dist::make_single_process_communicator());
  const auto again = resumed.run(/*stop_after=*/0);
  EXPECT_EQ(again.first_step, 2);
  EXPECT_TRUE(dspine::testing::same_weights(steps.before[2],
                                            dspine::testing::weights_of(resumed.module())));
}
