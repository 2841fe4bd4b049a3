#include "data/source_registry.h"

#include <torch/torch.h>

#include <filesystem>
#include <regex>

#include <fmt/format.h>

#include "core/error.h"
#include "target/hf_checkpoint.h"
#include "target/qwen3_model.h"
#include "data/random_source.h"
#include "data/shards.h"
#include "data/specforge_source.h"
#include "data/synthetic_source.h"
#include "data/target_source.h"

namespace dspine::data {
namespace {

std::unique_ptr<BatchSource> make_synthetic(const core::Config& config, const c10::Device&) {
  return std::make_unique<SyntheticSource>(config.data, config.model);
}

std::unique_ptr<BatchSource> make_random(const core::Config& config, const c10::Device& device) {
  return std::make_unique<RandomSource>(config.data, config.model, device);
}

std::unique_ptr<BatchSource> make_shards(const core::Config& config, const c10::Device&) {
  if (config.data.shards_dir.empty()) fail("data.source is 'shards' but data.shards_dir is empty");
  return std::make_unique<ShardReader>(config.data.shards_dir,
                                       shard_layout(config.data, config.model));
}

// The testbed directory (data/testbed-<size>, a size of scripts/make_testbed_target.py) that
// `path` lies in, as the command that writes it; "" for a path outside one.
std::string testbed_command(const std::string& path) {
  static const std::regex testbed("((?:.*/)?testbed-(tiny|gpu))(?:/.*)?");
  std::smatch match;
  if (!std::regex_match(path, match, testbed)) return "";
  return fmt::format("make it with python3 scripts/make_testbed_target.py --size {} --out {} "
                     "(docs/testbed.md)", match[2].str(), match[1].str());
}

constexpr const char* kTargetMadeBy = "it must be a Hugging Face Qwen3 directory (docs/target.md)";
constexpr const char* kSamplesMadeBy =
    "scripts/prepare_data.py writes token samples from chats (docs/data.md)";

// A data path the configuration names must exist before anything is loaded; otherwise an error
// names the key and the path, and how the file is made: the testbed's command for a testbed
// path, else `made_by`.
void require_data_path(const char* key, const std::string& path, const char* made_by) {
  if (path.empty() || std::filesystem::exists(path)) return;
  const std::string command = testbed_command(path);
  fail("{} {}: no such file or directory; {}", key, path, command.empty() ? made_by : command);
}

std::unique_ptr<BatchSource> make_target(const core::Config& config, const c10::Device& device) {
  const auto& data = config.data;
  require_data_path("data.target.path", data.target.path, kTargetMadeBy);
  require_data_path("data.samples", data.samples, kSamplesMadeBy);
  require_data_path("data.eval_samples_file", data.eval_samples_file, kSamplesMadeBy);
  return std::make_unique<TargetSource>(config.data, config.model,
                                        target_dtype(config.training.dtype, device), device);
}

std::unique_ptr<BatchSource> make_specforge(const core::Config& config, const c10::Device&) {
  require_data_path("data.target.path", config.data.target.path, kTargetMadeBy);
  return std::make_unique<SpecforgeSource>(config.data, config.model);
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
  auto held_out =
      std::make_unique<ShardReader>(data.eval_shards_dir, shard_layout(config.data, config.model));
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
  return {target::read_qwen3_config(origin).num_hidden_layers, origin};
}

// The synthetic target has no special tokens; shards and random values do not record them.
TargetTokenIds no_token_ids(const core::Config&) { return {}; }

// The target's own config.json (read and checked when the source was made).
TargetTokenIds target_config_token_ids(const core::Config& config) {
  const auto path = std::filesystem::path(config.data.target.path) / "config.json";
  const auto json = target::read_hf_config_json(path.string());
  return {json.value("bos_token_id", nlohmann::json()),
          json.value("eos_token_id", nlohmann::json())};
}

// One entry per enumerator of core::DataSource.
const DataSourceEntry kEntries[] = {
    {core::DataSource::kSynthetic, make_synthetic, "", nullptr, synthetic_depth, no_token_ids,
     false},
    {core::DataSource::kRandom, make_random, "", nullptr, unrecorded, no_token_ids, true},
    {core::DataSource::kShards, make_shards, "data.eval_shards_dir", held_out_shards, unrecorded,
     no_token_ids, false},
    {core::DataSource::kTarget, make_target, "data.eval_samples_file", held_out_samples,
     target_config_depth, target_config_token_ids, false},
    {core::DataSource::kSpecforge, make_specforge, "data.eval_specforge_dir", held_out_specforge,
     target_config_depth, target_config_token_ids, false},
};

}  // namespace

const DataSourceEntry& data_source_entry(core::DataSource source) {
  for (const DataSourceEntry& entry : kEntries) {
    if (entry.source == source) return entry;
  }
  fail("data.source {}: no data source registry entry", core::to_string(source));
}

}  // namespace dspine::data
