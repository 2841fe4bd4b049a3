#include "data/source_registry.h"

#include <torch/torch.h>

#include <filesystem>

#include "core/error.h"
#include "data/qwen3_model.h"
#include "data/random_source.h"
#include "data/shards.h"
#include "data/specforge_source.h"
#include "data/synthetic_source.h"
#include "data/target_source.h"

namespace dspine::data {
namespace {

std::unique_ptr<BatchSource> make_synthetic(const core::Config& config, const c10::Device&) {
  return std::make_unique<SyntheticSource>(config);
}

std::unique_ptr<BatchSource> make_random(const core::Config& config, const c10::Device& device) {
  return std::make_unique<RandomSource>(config, device);
}

std::unique_ptr<BatchSource> make_shards(const core::Config& config, const c10::Device&) {
  if (config.data.shards_dir.empty()) fail("data.source is 'shards' but data.shards_dir is empty");
  return std::make_unique<ShardReader>(config.data.shards_dir, layout_from_config(config));
}

std::unique_ptr<BatchSource> make_target(const core::Config& config, const c10::Device& device) {
  return std::make_unique<TargetSource>(config, device);
}

std::unique_ptr<BatchSource> make_specforge(const core::Config& config, const c10::Device&) {
  return std::make_unique<SpecforgeSource>(config);
}

std::unique_ptr<BatchSource> held_out_samples(const core::Config& config, BatchSource& training) {
  const std::string& file = config.data.eval_samples_file;
  if (file.empty()) return nullptr;
  return std::make_unique<TargetSource>(dynamic_cast<TargetSource&>(training), file);
}

std::unique_ptr<BatchSource> held_out_specforge(const core::Config& config, BatchSource& training) {
  const std::string& dir = config.data.eval_specforge_dir;
  if (dir.empty()) return nullptr;
  return std::make_unique<SpecforgeSource>(dynamic_cast<SpecforgeSource&>(training), dir);
}

std::unique_ptr<BatchSource> held_out_shards(const core::Config& config, BatchSource& training) {
  const auto& data = config.data;
  if (data.eval_shards_dir.empty()) return nullptr;
  auto held_out = std::make_unique<ShardReader>(data.eval_shards_dir, layout_from_config(config));
  // Shards of another target would be judged against the wrong tables.
  if (!held_out->embed_tokens().equal(training.embed_tokens()) ||
      !held_out->lm_head().equal(training.lm_head())) {
    fail(
        "data.eval_shards_dir {}: its target.safetensors differs from data.shards_dir {}'s: "
        "held-out shards must come from the training run's target",
        data.eval_shards_dir, data.shards_dir);
  }
  return held_out;
}

RecordedDepth unrecorded(const core::Config&) { return {}; }

RecordedDepth synthetic_depth(const core::Config& config) {
  return {config.data.synthetic.num_layers, "data.synthetic.num_layers"};
}

// The target's own config.json.
RecordedDepth target_config_depth(const core::Config& config) {
  const std::string origin =
      (std::filesystem::path(config.data.target.path) / "config.json").string();
  return {read_qwen3_config(origin).num_hidden_layers, origin};
}

// One entry per enumerator of core::DataSource.
const DataSourceEntry kEntries[] = {
    {core::DataSource::kSynthetic, make_synthetic, "", nullptr, synthetic_depth, false},
    {core::DataSource::kRandom, make_random, "", nullptr, unrecorded, true},
    {core::DataSource::kShards, make_shards, "data.eval_shards_dir", held_out_shards, unrecorded,
     false},
    {core::DataSource::kTarget, make_target, "data.eval_samples_file", held_out_samples,
     target_config_depth, false},
    {core::DataSource::kSpecforge, make_specforge, "data.eval_specforge_dir", held_out_specforge,
     target_config_depth, false},
};

}  // namespace

const DataSourceEntry& data_source_entry(core::DataSource source) {
  for (const DataSourceEntry& entry : kEntries) {
    if (entry.source == source) return entry;
  }
  fail("data.source {}: no data source registry entry", core::to_string(source));
}

}  // namespace dspine::data
