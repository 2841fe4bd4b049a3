// The acceptance evaluation during training (training.eval_every): its eval/... metrics land in
// the metrics file at every eval_every steps and at the end, equal a direct measurement of the
// trained draft on the same samples, and leave the training itself bitwise unchanged (including
// across a resume). dspine-eval on the saved checkpoint is compared by ctest eval_matches_cli.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/dspine_tiny.h"
#include "common/nonfinite.h"
#include "core/config.h"
#include "core/error.h"
#include "core/files.h"
#include "core/safetensors.h"
#include "data/batch_source.h"
#include "dist/communicator.h"
#include "model/module_state.h"
#include "objectives/acceptance.h"
#include "objectives/dspine_objective.h"
#include "objectives/dspine_settings.h"
#include "train/run_config.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using dspine::core::Config;

namespace {

fs::path fresh_dir(const std::string& name) {
  auto dir = fs::temp_directory_path() / ("dspine_test_" + name + "_" + std::to_string(::getpid()));
  dspine::core::remove_tree(dir.string());
  fs::create_directories(dir);
  return dir;
}

// configs/tiny.yaml for `steps` steps, logged every 2, evaluated every `eval_every` on 8 samples.
Config eval_config(const fs::path& dir, int64_t steps, int64_t eval_every) {
  Config config = dspine::train::load_run_config("");
  config.training.total_steps = steps;
  config.training.eval_every = eval_every;
  config.data.eval_samples = 8;
  config.checkpoint.dir = (dir / "checkpoints").string();
  config.checkpoint.resume = "none";
  config.logging.every = 2;
  config.logging.metrics_file = (dir / "metrics.jsonl").string();
  config.logging.progress = dspine::core::ProgressMode::kOff;
  config.logging.level = dspine::core::LogLevel::kWarn;
  return config;
}

std::vector<nlohmann::json> records_of(const Config& config) {
  std::ifstream in(config.logging.metrics_file);
  std::vector<nlohmann::json> records;
  for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
  return records;
}

}  // namespace

TEST(TrainerEval, MetricsAppearAtEveryEvalStepAndTheEnd) {
  auto dir = fresh_dir("eval_metrics");
  auto config = eval_config(dir, 5, 3);
  dspine::train::Trainer trainer(config, dspine::dist::make_single_process_communicator());
  trainer.run();
  std::vector<int64_t> eval_steps, logged_steps;
  for (const auto& r : records_of(config)) {
    if (r.contains("loss")) logged_steps.push_back(r["step"]);
    if (!r.contains("eval/tau")) continue;
    eval_steps.push_back(r["step"]);
    for (const char* key : {"eval/tau_refine", "eval/tau_sampled", "eval/accuracy",
                            "eval/accept_1", "eval/accept_2", "eval/accept_3",
                            "eval/accept_refine_3", "eval/blocks", "eval/offset", "eval/time_s"}) {
      EXPECT_TRUE(r.contains(key)) << key << " missing in " << r.dump();
    }
    EXPECT_FALSE(r.contains("eval/accept_4")) << "block_size 4 has 3 proposals";
    EXPECT_GE(r["eval/tau"].get<double>(), 1.0);
    EXPECT_LE(r["eval/tau"].get<double>(), 4.0);
    // Held-out: the first sample past the 5 steps × 2 micro-batches × 4 rows trained on.
    EXPECT_EQ(r["eval/offset"].get<int64_t>(), 40);
  }
  // Step 3 is not a logging step: its own record; step 5 (the end) shares the step's record.
  EXPECT_EQ(eval_steps, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(logged_steps, (std::vector<int64_t>{2, 4, 5}));
}

// The figures logged at the end equal the evaluator measuring the saved final checkpoint, the
// way dspine-eval --acceptance does (same samples, batches and anchors).
TEST(TrainerEval, FinalMetricsEqualADirectMeasurement) {
  auto dir = fresh_dir("eval_direct");
  auto config = eval_config(dir, 4, 4);
  dspine::train::Trainer trainer(config, dspine::dist::make_single_process_communicator());
  const auto checkpoint = trainer.run().last_checkpoint;
  const auto logged = records_of(config).back();
  ASSERT_TRUE(logged.contains("eval/tau")) << logged.dump();

  auto source = dspine::data::make_batch_source(config, torch::kCPU);
  auto objective = dspine::objectives::make_dspine_objective(
      dspine::testing::draft_config(config),
      config.section<dspine::objectives::DSpineSettings>("objective.dspine"),
      config.training.accumulation_steps, source->embed_tokens(), source->lm_head(), torch::kCPU,
      torch::kFloat32);
  dspine::model::load_module_state(
      *objective->module(),
      dspine::core::load_safetensors(dspine::model::weights_file(checkpoint)));
  dspine::objectives::AcceptanceEvaluator evaluator(
      config.section<dspine::objectives::DSpineSettings>("objective.dspine"), config.data.seq_len,
      static_cast<uint64_t>(config.training.seed), objective->draft(),
      objective->training_model().embed_tokens(), objective->training_model().lm_head());
  auto batches = dspine::objectives::held_out_batches(
      *source, dspine::core::eval_offset(config, 1), config.data.eval_samples,
      config.training.batch_size, torch::kCPU);
  auto comm = dspine::dist::make_single_process_communicator();
  for (const auto& [name, value] :
       dspine::objectives::acceptance_metrics(evaluator.measure(batches, *comm))) {
    EXPECT_EQ(logged["eval/" + name].get<double>(), value) << name;
  }
}

// Evaluating never moves a training RNG stream or the data: losses and weights are bitwise those
// of a run without evaluation, also when the evaluating run is interrupted and resumed.
TEST(TrainerEval, EvaluationLeavesTrainingBitwiseUnchangedAcrossAResume) {
  auto dir = fresh_dir("eval_resume");
  auto evaluated = eval_config(dir / "a", 6, 2);
  std::vector<double> losses;
  {
    dspine::train::Trainer first(evaluated, dspine::dist::make_single_process_communicator());
    losses = first.run(3).losses;
  }
  evaluated.checkpoint.resume = "auto";
  dspine::train::Trainer second(evaluated, dspine::dist::make_single_process_communicator());
  auto rest = second.run().losses;
  losses.insert(losses.end(), rest.begin(), rest.end());

  auto plain = eval_config(dir / "b", 6, 0);
  dspine::train::Trainer reference(plain, dspine::dist::make_single_process_communicator());
  auto expected = reference.run().losses;
  EXPECT_EQ(losses, expected);
  EXPECT_TRUE(dspine::testing::same_weights(dspine::testing::weights_of(second.module()),
                                            dspine::testing::weights_of(reference.module())));
}
