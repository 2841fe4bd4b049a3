// What a run does before and around its first step: training.init_from starts any objective from
// a checkpoint's weights with a fresh optimizer, schedule and data position; a bad sample stops
// the run before step 1, one that fails later (the file changed) saves the state before its step;
// default evaluation rows the run trains on are refused before training.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/expect_error.h"
#include "common/fresh_dir.h"
#include "common/small_run.h"
#include "core/config.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "model/dspine_config.h"
#include "data/batch.h"
#include "dist/communicator.h"
#include "train/checkpoint.h"
#include "train/run_config.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using dspine::core::Config;
using dspine::testing::expect_error_mentioning;
using dspine::testing::fresh_dir;

namespace {

std::shared_ptr<dspine::dist::Communicator> one_process() {
  return dspine::dist::make_single_process_communicator();
}

// Every parameter and buffer of `module` equals the checkpoint's model.safetensors.
void expect_weights_of(torch::nn::Module& module, const std::string& checkpoint) {
  const auto saved =
      dspine::core::load_safetensors((fs::path(checkpoint) / "model.safetensors").string());
  size_t compared = 0;
  for (const auto& item : module.named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value().cpu(), saved.at(item.key()))) << item.key();
    ++compared;
  }
  for (const auto& item : module.named_buffers()) {
    EXPECT_TRUE(torch::equal(item.value().cpu(), saved.at(item.key()))) << item.key();
  }
  EXPECT_EQ(compared, module.named_parameters().size());
  EXPECT_GT(compared, 0u);
}

// data.source target with seeded random weights of a tiny Qwen3 config.json written into `dir`
// (no weights file needed) over the token samples `samples`.
Config online_target_config(const fs::path& dir, const fs::path& samples, int64_t steps) {
  std::ofstream(dir / "config.json")
      << R"({"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 96,
             "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16, "vocab_size": 256})";
  Config config = dspine::testing::small_run_config(dir, steps);
  config.model.hidden_size = 64;
  config.model.vocab_size = 256;
  config.data.source = dspine::core::DataSource::kTarget;
  config.data.target.path = dir.string();
  config.data.target.random = true;
  config.data.samples = samples.string();
  config.data.seq_len = 16;
  return config;
}

// `count` valid token-sample lines of 16 tokens; line `bad` (1-based, 0 = none) holds `bad_text`.
void write_samples(const fs::path& path, int count, int bad = 0,
                   const std::string& bad_text = "") {
  std::ofstream out(path);
  for (int line = 1; line <= count; ++line) {
    if (line == bad) {
      out << bad_text << "\n";
      continue;
    }
    out << R"({"input_ids": [)";
    for (int t = 0; t < 16; ++t) out << (t ? "," : "") << (line * 7 + t * 3) % 250;
    out << R"(], "loss_mask": [0,0,1,1,1,1,1,1,1,1,1,1,1,1,1,1]})" << "\n";
  }
}

}  // namespace

TEST(TrainerStart, InitFromStartsEveryObjectiveFromTheWeightsOnly) {
  const auto dir = fresh_dir("init_from");
  for (const bool dspine : {true, false}) {
    const auto sub = dir / (dspine ? "dspine" : "ce");
    Config first = dspine ? dspine::testing::tiny_dspine_run_config(sub / "a", 3)
                          : dspine::testing::small_run_config(sub / "a", 3);
    dspine::train::Trainer a(first, one_process());
    const std::string checkpoint = a.run().last_checkpoint;
    ASSERT_FALSE(checkpoint.empty());

    Config second = first;
    second.checkpoint.dir = (sub / "b" / "checkpoints").string();
    second.training.init_from = checkpoint;
    {
      dspine::train::Trainer b(second, one_process());
      EXPECT_EQ(b.run(0).first_step, 0);  // start-up only: a fresh run, no step taken
      expect_weights_of(b.module(), checkpoint);
    }
    // The optimizer, schedule and data position start afresh: the run trains its own 3 steps
    // from sample 0, and reads the rows the first run read.
    dspine::train::Trainer b(second, one_process());
    const auto result = b.run();
    EXPECT_EQ(result.first_step, 0);
    EXPECT_EQ(result.final_step, 3);
    EXPECT_EQ(dspine::train::checkpoint_state(result.last_checkpoint)->data_cursor,
              dspine::train::checkpoint_state(checkpoint)->data_cursor);
  }
}

TEST(TrainerStart, GspoInitFromIsAnAliasOfTrainingInitFrom) {
  const auto dir = fresh_dir("init_from_alias");
  Config config = dspine::testing::tiny_dspine_run_config(dir, 1);
  config.objective.name = "gspo";
  config.training.init_from = "runs/a/step-000010";
  // The rule is checked where the configuration is parsed, before any set-up.
  expect_error_mentioning(
      [&] {
        dspine::train::parse_run_config(dspine::core::to_yaml(config), "run.yaml",
                                        {"objective.gspo.init_from=runs/b/step-000010"});
      },
      {"objective.gspo.init_from = runs/b/step-000010", "the same as training.init_from"});
}

TEST(TrainerStart, ABadSampleLineStopsTheRunBeforeStepOne) {
  const auto dir = fresh_dir("bad_line");
  write_samples(dir / "samples.jsonl", 120, 100, R"({"input_ids": [1, 2], "loss_mask": [1]})");
  const Config config = online_target_config(dir, dir / "samples.jsonl", 4);
  expect_error_mentioning(
      [&] {
        dspine::train::Trainer trainer(config, one_process());
        trainer.run();
      },
      {(dir / "samples.jsonl").string() + ":100", "loss_mask"});
  EXPECT_FALSE(fs::exists(config.checkpoint.dir));  // no step, nothing saved
}

TEST(TrainerStart, DataThatFailsMidRunSavesTheStateBeforeItsStep) {
  const auto dir = fresh_dir("data_fails_late");
  write_samples(dir / "samples.jsonl", 64);
  Config config = online_target_config(dir, dir / "samples.jsonl", 6);
  {
    dspine::train::Trainer trainer(config, one_process());
    // The file changes under the running job: sample 13 (line 14), read by step 4, goes bad. The
    // line keeps its length so the other samples stay where the start-up pass found them.
    trainer.set_batch_hook([&](int64_t step, int64_t micro, dspine::data::DraftBatch&) {
      if (step != 2 || micro != 1) return;
      std::fstream file(dir / "samples.jsonl", std::ios::in | std::ios::out);
      std::string line;
      for (int i = 0; i < 13; ++i) std::getline(file, line);
      const auto at = file.tellp();
      std::getline(file, line);
      file.seekp(at);
      file << std::string(line.size(), 'x');
    });
    expect_error_mentioning([&] { trainer.run(); },
                            {"step 4: ", "samples.jsonl:14", "invalid JSON",
                             "the state before this step is saved in", "step-000003"});
  }
  const auto saved = dspine::train::checkpoint_state(
      (fs::path(config.checkpoint.dir) / "step-000003").string());
  ASSERT_TRUE(saved.has_value());
  EXPECT_EQ(saved->data_cursor, 3 * 2 * 2);  // steps x accumulation x rows: step 4 reads again
}

TEST(TrainerStart, DefaultEvaluationRowsTheRunTrainsOnAreRefused) {
  const auto dir = fresh_dir("held_out_refused");
  write_samples(dir / "samples.jsonl", 20);
  Config config = online_target_config(dir, dir / "samples.jsonl", 5);  // reads all 20 rows
  config.model.architecture = "dspine";
  config.objective.name = "dspine";
  config.set_section("model.dspine", dspine::model::DSpineConfig{16, 16, 4});
  config.model.target_layer_ids = {0, 2};
  config.training.eval_every = 5;
  config.data.eval_samples = 4;
  expect_error_mentioning(
      [&] {
        dspine::train::Trainer trainer(config, one_process());
        trainer.run();
      },
      {"no held-out rows", "holds 20 samples", "read 20", "data.eval_samples_file"});
  EXPECT_FALSE(fs::exists(fs::path(config.checkpoint.dir) / "step-000001"));

  // A separate held-out file is measured from its first sample, and the run trains.
  write_samples(dir / "held_out.jsonl", 4);
  config.data.eval_samples_file = (dir / "held_out.jsonl").string();
  config.checkpoint.dir = (dir / "second").string();
  dspine::train::Trainer trainer(config, one_process());
  EXPECT_EQ(trainer.run().final_step, 5);
}
