// `dspine-data export` (docs/model.md#export-and-import) on a trained tiny DSpine draft: the
// export holds the checkpoint's tensors bitwise in the reference order and a config.json with
// every key of the reference draft config; a draft loaded from it gives the same forward outputs
// bitwise; GSPO starts from it; it never overwrites; a run whose model differs is refused with
// the key and both values.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/dspine_tiny.h"
#include "common/expect_error.h"
#include "common/fresh_dir.h"
#include "common/small_run.h"
#include "core/config.h"
#include "core/safetensors.h"
#include "data/batch_source.h"
#include "dist/communicator.h"
#include "model/draft_loading.h"
#include "model/hf_draft_config.h"
#include "model/module_state.h"
#include "objectives/dspine_objective.h"
#include "objectives/dspine_settings.h"
#include "objectives/gspo_objective.h"
#include "train/hf_export.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using dspine::core::Config;
using dspine::testing::expect_error_mentioning;
using nlohmann::json;

namespace {

using dspine::testing::fresh_dir;

// The embedded tiny DSpine configuration (configs/tiny.yaml) on the CPU.
Config tiny_dspine_config(const fs::path& dir, int64_t total_steps) {
  Config config = dspine::testing::tiny_dspine_run_config(dir, total_steps);
  config.training.device = dspine::core::Device::kCpu;
  return config;
}

// Trains three steps once for every test of this file; returns the final checkpoint.
const std::string& trained_checkpoint() {
  static const std::string checkpoint = [] {
    auto config = tiny_dspine_config(fresh_dir("export_sft"), 3);
    dspine::train::Trainer trainer(config, dspine::dist::make_single_process_communicator());
    return trainer.run().last_checkpoint;
  }();
  return checkpoint;
}

// A fresh objective of `config` whose draft is loaded by `load`, and its forward outputs on a
// fixed batch of the config's data source with fixed anchors.
std::vector<at::Tensor> forward_outputs(const Config& config,
                                        const std::function<void(dspine::model::DSpineDraftImpl&)>& load) {
  auto source = dspine::data::make_batch_source(config, torch::kCPU);
  torch::manual_seed(99);  // the draft's initialisation, overwritten by the load
  auto objective = dspine::objectives::make_dspine_objective(
      dspine::testing::draft_config(config),
      config.section<dspine::objectives::DSpineSettings>("objective.dspine"),
      config.training.accumulation_steps, source->embed_tokens(), source->lm_head(), torch::kCPU,
      torch::kFloat32);
  load(*objective->draft());
  source->seek(5000);
  const auto batch = source->next(2);
  const dspine::objectives::RowStreams streams{7, 0, 0};
  auto comm = dspine::dist::make_single_process_communicator();
  dspine::objectives::DSpineForwardOptions options;
  options.total_steps = config.training.total_steps;
  options.training = false;
  options.comm = comm.get();
  torch::NoGradGuard no_grad;
  const auto out = objective->training_model().forward(batch, streams, options);
  return {out.loss, out.ce, out.l1, out.refinement, out.alignment, out.correct, out.coverage};
}

TEST(HfExport, HoldsTheCheckpointsTensorsBitwiseAndEveryReferenceConfigKey) {
  const auto dir = fresh_dir("export_layout");
  const fs::path checkpoint = trained_checkpoint();
  const auto out = dir / "draft";
  const auto summary = dspine::train::export_draft(checkpoint.string(), out.string());
  EXPECT_EQ(summary.dtype, "float32");

  const auto saved = dspine::core::load_safetensors((checkpoint / "model.safetensors").string());
  const auto exported = dspine::core::load_safetensors((out / "model.safetensors").string());
  ASSERT_EQ(exported.tensors.size(), saved.tensors.size());
  EXPECT_EQ(summary.tensors, static_cast<int64_t>(saved.tensors.size()));
  for (size_t i = 0; i < saved.tensors.size(); ++i) {
    const auto& [name, tensor] = saved.tensors[i];
    EXPECT_EQ(exported.tensors[i].first, name) << "order at " << i;
    EXPECT_EQ(exported.at(name).scalar_type(), tensor.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(exported.at(name), tensor)) << name;
  }
  EXPECT_EQ(exported.at("transfer_ready").dim(), 0);
  EXPECT_EQ(exported.at("transfer_ready").scalar_type(), torch::kBool);
  EXPECT_TRUE(exported.at("transfer_ready").item<bool>());
  EXPECT_EQ(exported.metadata.at("format"), "pt");  // transformers refuses safetensors without it

  const json config = dspine::model::read_json_file((out / "config.json").string());
  for (const char* key :
       {"architectures", "attention_bias", "attention_dropout", "auto_map", "block_size",
        "bos_token_id", "dflash_config", "dspine_config", "dtype", "eos_token_id", "head_dim",
        "hidden_act", "hidden_size", "initializer_range", "intermediate_size", "is_causal",
        "layer_types", "max_position_embeddings", "max_window_layers", "model_type",
        "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "num_target_layers",
        "rms_norm_eps", "rope_parameters", "rope_theta", "sliding_window", "tie_word_embeddings",
        "use_cache", "use_sliding_window", "vocab_size"}) {
    EXPECT_TRUE(config.contains(key)) << key;
  }
  EXPECT_EQ(config["architectures"], json::array({"DSpineDraftModel"}));
  EXPECT_EQ(config["model_type"], "qwen3");
  EXPECT_EQ(config["dflash_config"],
            json({{"block_size", 4}, {"mask_token_id", 255}, {"target_layer_ids", {0, 1, 2}}}));
  EXPECT_EQ(config["dspine_config"].size(), 11u);
  EXPECT_EQ(config["num_target_layers"], 4);  // the synthetic target's depth
  // The checkpoint's own config.json carries the same values.
  const json source = dspine::model::read_json_file((checkpoint / "config.json").string());
  for (const auto& [key, value] : source.items()) EXPECT_EQ(config[key], value) << key;

  // An export exports again to the same bytes.
  dspine::train::export_draft(out.string(), (dir / "again").string());
  const auto again = dspine::core::load_safetensors((dir / "again" / "model.safetensors").string());
  for (const auto& [name, tensor] : exported.tensors) EXPECT_TRUE(torch::equal(again.at(name), tensor)) << name;
  EXPECT_EQ(dspine::model::read_json_file((dir / "again" / "config.json").string()), config);
}

// A bf16 draft stays bf16 (its bytes unchanged), its transfer codes fp32, and config.json says so.
// A config.json with only the keys a loader needs is completed.
TEST(HfExport, CompletesAShortConfigAndKeepsTheDraftsDtype) {
  const auto dir = fresh_dir("export_bf16");
  const fs::path checkpoint = trained_checkpoint();
  const auto source = dir / "bf16";
  fs::create_directories(source);
  json short_config = dspine::model::read_json_file((checkpoint / "config.json").string());
  for (const char* key : {"num_target_layers", "max_position_embeddings", "bos_token_id",
                          "eos_token_id", "block_size"}) {
    short_config.erase(key);
  }
  short_config["dspine_config"] = {{"transfer_rank", 32}, {"message_size", 16}, {"top_k", 8},
                                   {"ce_weight", 0.25}};
  std::ofstream(source / "config.json") << short_config.dump();
  auto tensors = dspine::core::load_safetensors((checkpoint / "model.safetensors").string()).tensors;
  for (auto& [name, tensor] : tensors) {
    if (name != "transfer_codes" && name != "transfer_ready") tensor = tensor.to(torch::kBFloat16);
  }
  dspine::core::save_safetensors((source / "model.safetensors").string(), tensors);

  const auto summary = dspine::train::export_draft(source.string(), (dir / "draft").string());
  EXPECT_EQ(summary.dtype, "bfloat16");
  const auto exported = dspine::core::load_safetensors((dir / "draft" / "model.safetensors").string());
  for (const auto& [name, tensor] : tensors) {
    EXPECT_EQ(exported.at(name).scalar_type(), tensor.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(exported.at(name), tensor)) << name;
  }
  EXPECT_EQ(exported.at("transfer_codes").scalar_type(), torch::kFloat32);
  const json config = dspine::model::read_json_file((dir / "draft" / "config.json").string());
  EXPECT_EQ(config["dtype"], "bfloat16");
  EXPECT_EQ(config["block_size"], 4);
  EXPECT_EQ(config["num_target_layers"], 3);  // the least depth holding target layers 0, 1, 2
  EXPECT_FALSE(config.contains("max_position_embeddings"));  // unknown: transformers' default
  EXPECT_EQ(config["dspine_config"].size(), 11u);
  EXPECT_EQ(config["dspine_config"]["ce_weight"], 0.25);
  EXPECT_EQ(config["dspine_config"]["replacement_layers"], 3);
  EXPECT_EQ(config["dspine_config"]["alignment_warmup_steps"], 146);  // the reference default
}

TEST(HfExport, LoadedDraftGivesTheCheckpointsForwardOutputsBitwise) {
  const auto dir = fresh_dir("export_forward");
  const std::string checkpoint = trained_checkpoint();
  const auto out = (dir / "draft").string();
  dspine::train::export_draft(checkpoint, out);
  const auto config = tiny_dspine_config(dir, 3);
  const auto reference = forward_outputs(config, [&](dspine::model::DSpineDraftImpl& draft) {
    dspine::model::load_module_state(
        draft, dspine::core::load_safetensors(checkpoint + "/model.safetensors"));
  });
  const auto loaded = forward_outputs(
      config, [&](dspine::model::DSpineDraftImpl& draft) { dspine::model::load_draft(draft, out); });
  ASSERT_EQ(loaded.size(), reference.size());
  EXPECT_GT(reference[0].item<double>(), 0.0);
  for (size_t i = 0; i < reference.size(); ++i) {
    EXPECT_TRUE(torch::equal(loaded[i], reference[i])) << "output " << i;
  }
}

TEST(HfExport, GspoStartsFromTheExport) {
  const auto dir = fresh_dir("export_gspo");
  const auto out = (dir / "draft").string();
  dspine::train::export_draft(trained_checkpoint(), out);
  auto config = tiny_dspine_config(dir / "rl", 1);
  config.objective.name = "gspo";
  dspine::objectives::GspoSettings gspo;
  gspo.rollout.group_size = 3;
  gspo.init_from = out;
  config.set_section("objective.gspo", gspo);
  dspine::train::Trainer rl(config, dspine::dist::make_single_process_communicator());
  rl.run(0);  // start-up only: loads init_from, takes no step
  const auto exported = dspine::core::load_safetensors(out + "/model.safetensors");
  for (const auto& [name, tensor] : dspine::model::module_state(rl.module())) {
    EXPECT_TRUE(torch::equal(tensor, exported.at(name))) << name;
  }

  // Same shapes, another draft: only config.json tells them apart.
  auto dspine = config.section<dspine::model::DSpineConfig>("model.dspine");
  dspine.top_k = 4;
  config.set_section("model.dspine", dspine);
  config.checkpoint.dir = (dir / "rl2").string();
  expect_error_mentioning(
      [&] {
        dspine::train::Trainer other(config, dspine::dist::make_single_process_communicator());
        other.run(0);
      },
      {out + "/config.json", "dspine_config.top_k is 8, the run's model has 4"});
}

TEST(HfExport, NeverOverwritesAndNamesTheBadFile) {
  const auto dir = fresh_dir("export_refusals");
  const std::string checkpoint = trained_checkpoint();
  const auto out = dir / "draft";
  fs::create_directories(out);
  std::ofstream(out / "keep.txt") << "mine";
  expect_error_mentioning([&] { dspine::train::export_draft(checkpoint, out.string()); },
                          {out.string(), "already exists"});
  EXPECT_TRUE(fs::exists(out / "keep.txt"));
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));

  // A copy of the checkpoint without its manifest, then with a broken draft.
  const auto copy = dir / "copy";
  fs::create_directories(copy);
  for (const char* file : {"config.json", "model.safetensors"}) fs::copy(fs::path(checkpoint) / file, copy / file);
  auto weights = dspine::core::load_safetensors((copy / "model.safetensors").string());
  auto tensors = weights.tensors;
  tensors.pop_back();  // transfer_ready
  tensors.emplace_back("transfer_ready", torch::zeros({}, torch::kBool));
  dspine::core::save_safetensors((copy / "model.safetensors").string(), tensors);
  expect_error_mentioning([&] { dspine::train::export_draft(copy.string(), (dir / "a").string()); },
                          {"model.safetensors", "transfer space was never built"});
  tensors.pop_back();
  dspine::core::save_safetensors((copy / "model.safetensors").string(), tensors);
  expect_error_mentioning([&] { dspine::train::export_draft(copy.string(), (dir / "b").string()); },
                          {"model.safetensors", "has no tensor transfer_ready"});
  tensors.emplace_back("transfer_ready", torch::ones({}, torch::kBool));
  tensors[0].second = tensors[0].second.clone();
  tensors[0].second.view(-1)[0] = std::nan("");
  dspine::core::save_safetensors((copy / "model.safetensors").string(), tensors);
  expect_error_mentioning([&] { dspine::train::export_draft(copy.string(), (dir / "c").string()); },
                          {"model.safetensors", tensors[0].first, "NaN"});
  std::ofstream(copy / "config.json") << R"({"architectures": ["SimpleDraft"]})";
  expect_error_mentioning([&] { dspine::train::export_draft(copy.string(), (dir / "d").string()); },
                          {"config.json", "not a DSpine draft"});
  for (const char* name : {"a", "b", "c", "d"}) EXPECT_FALSE(fs::exists(dir / name)) << name;
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().filename().string().rfind(".tmp-", 0), std::string::npos)
        << entry.path();
  }
}

}  // namespace
