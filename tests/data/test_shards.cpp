#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/expect_error.h"
#include "core/checksum.h"
#include "core/error.h"
#include "core/files.h"
#include "core/safetensors.h"
#include "data/batch_source.h"
#include "data/shards.h"
#include "data/synthetic_target.h"

namespace dspine::data {
namespace {

using dspine::testing::expect_error_mentioning;
namespace fs = std::filesystem;

core::Config small_config() {
  core::Config config;
  config.model.hidden_size = 16;
  config.model.vocab_size = 48;
  config.model.target_layer_ids = {0, 2};
  config.data.seq_len = 10;
  config.data.synthetic.num_layers = 3;
  config.data.synthetic.num_attention_heads = 2;
  config.data.synthetic.num_key_value_heads = 1;
  config.data.synthetic.head_dim = 8;
  config.data.synthetic.intermediate_size = 32;
  config.data.synthetic.prompt_length = 2;
  return config;
}

// A fresh directory per test, removed afterwards.
class Shards : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            fmt::format("dspine-test-shards-{}-{}", getpid(),
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    dspine::core::remove_tree(root_.string());
    fs::create_directories(root_);
  }
  void TearDown() override { dspine::core::remove_tree(root_.string()); }

  // Writes 5 samples in shards of 2 (3 shards, the last one short).
  std::string write(const std::string& dtype = "fp32") {
    const std::string dir = (root_ / "shards").string();
    write_into(dir, ShardWriteOptions{5, 2, dtype});
    return dir;
  }

  static void write_into(const std::string& dir, const ShardWriteOptions& options) {
    const auto config = small_config();
    write_shards(*make_batch_source(config, torch::kCPU), config.data,
                 shard_layout(config.data, config.model), dir, options);
  }

  fs::path root_;
};

DraftBatch live_samples(const std::vector<int64_t>& indices) {
  const auto config = small_config();
  const SyntheticTarget target(config.model, config.data.synthetic);
  std::vector<DraftBatch> samples;
  for (int64_t i : indices) samples.push_back(target.sample(i, config.data.seq_len));
  return concat_rows(samples);
}

void expect_batches_equal(const DraftBatch& a, const DraftBatch& b) {
  EXPECT_TRUE(torch::equal(a.input_ids, b.input_ids));
  EXPECT_TRUE(torch::equal(a.loss_mask, b.loss_mask));
  EXPECT_TRUE(torch::equal(a.hidden_states, b.hidden_states));
  EXPECT_TRUE(torch::equal(a.target_last_hidden_states, b.target_last_hidden_states));
}

TEST_F(Shards, WrittenShardsReadBackAsTheLiveSamples) {
  const std::string dir = write();
  EXPECT_FALSE(fs::exists(dir + ".partial"));
  const ShardIndex index = read_shard_index(dir);
  ASSERT_EQ(index.shards.size(), 3u);
  EXPECT_EQ(index.shards[2].file, "shard-00002.safetensors");
  EXPECT_EQ(index.shards[2].first_sample, 4);
  EXPECT_EQ(index.shards[2].samples, 1);

  const auto shard = core::load_safetensors((fs::path(dir) / "shard-00001.safetensors").string());
  EXPECT_EQ(shard.at("hidden_states").sizes(), torch::IntArrayRef({2, 10, 32}));
  EXPECT_EQ(shard.metadata.at("sample_offset"), "2");
  EXPECT_EQ(shard.metadata.at("num_target_layers"), "2");

  ShardReader reader(dir, shard_layout(small_config().data, small_config().model));
  expect_batches_equal(reader.next(5), live_samples({0, 1, 2, 3, 4}));
  const auto config = small_config();
  const SyntheticTarget target(config.model, config.data.synthetic);
  EXPECT_TRUE(torch::equal(reader.embed_tokens(), target.embed_tokens()));
  EXPECT_TRUE(torch::equal(reader.lm_head(), target.lm_head()));
}

TEST_F(Shards, ReaderWrapsAroundEpochsAndSeeks) {
  ShardReader reader(write(), shard_layout(small_config().data, small_config().model));
  reader.next(3);
  EXPECT_EQ(reader.cursor(), 3);
  expect_batches_equal(reader.next(3), live_samples({3, 4, 0}));  // crosses the epoch boundary
  EXPECT_EQ(reader.cursor(), 6);
  reader.seek(12);  // epoch 2, sample 2
  expect_batches_equal(reader.next(2), live_samples({2, 3}));
  EXPECT_THROW(reader.seek(-1), Error);
}

TEST_F(Shards, Bf16ShardsServeFp32HiddenStates) {
  ShardReader reader(write("bf16"), shard_layout(small_config().data, small_config().model));
  const DraftBatch read = reader.next(5), live = live_samples({0, 1, 2, 3, 4});
  EXPECT_EQ(read.hidden_states.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(read.input_ids, live.input_ids));
  EXPECT_TRUE(torch::equal(read.hidden_states, live.hidden_states.to(torch::kBFloat16).to(torch::kFloat)));
  EXPECT_FALSE(torch::equal(read.hidden_states, live.hidden_states));
}

TEST_F(Shards, MakeBatchSourceServesEitherSourceByCursor) {
  auto config = small_config();
  auto synthetic = make_batch_source(config, torch::kCPU);
  expect_batches_equal(synthetic->next(2), live_samples({0, 1}));
  synthetic->seek(4);
  expect_batches_equal(synthetic->next(1), live_samples({4}));
  EXPECT_EQ(synthetic->cursor(), 5);

  config.data.source = dspine::core::DataSource::kShards;
  config.data.shards_dir = write();
  auto shards = make_batch_source(config, torch::kCPU);
  shards->seek(1);
  expect_batches_equal(shards->next(2), live_samples({1, 2}));
  EXPECT_TRUE(torch::equal(shards->lm_head(), synthetic->lm_head()));

  config.data.shards_dir = "";
  expect_error_mentioning([&] { make_batch_source(config, torch::kCPU); }, {"data.shards_dir"});
}

TEST_F(Shards, MissingShardFileIsNamed) {
  const std::string dir = write();
  fs::remove(fs::path(dir) / "shard-00001.safetensors");
  expect_error_mentioning(
      [&] { ShardReader(dir, shard_layout(small_config().data, small_config().model)); },
      {"shard-00001.safetensors", "missing"});
}

TEST_F(Shards, IndexRecordsEveryFilesSizeAndSha256) {
  const std::string dir = write();
  const ShardIndex index = read_shard_index(dir);
  ASSERT_TRUE(index.target_digest.has_value());
  const auto target = core::digest_file((fs::path(dir) / "target.safetensors").string());
  EXPECT_EQ(index.target_digest->sha256, target.sha256);
  EXPECT_EQ(index.target_digest->bytes, target.bytes);
  for (const ShardEntry& entry : index.shards) {
    ASSERT_TRUE(entry.digest.has_value());
    const auto found = core::digest_file((fs::path(dir) / entry.file).string());
    EXPECT_EQ(entry.digest->sha256, found.sha256) << entry.file;
    EXPECT_EQ(entry.digest->bytes, static_cast<int64_t>(fs::file_size(fs::path(dir) / entry.file)));
  }
}

TEST_F(Shards, TruncatedShardStopsTheReaderBeforeTraining) {
  const std::string dir = write();
  const fs::path shard = fs::path(dir) / "shard-00002.safetensors";
  fs::resize_file(shard, fs::file_size(shard) / 2);
  expect_error_mentioning(
      [&] { ShardReader(dir, shard_layout(small_config().data, small_config().model)); },
      {"shard-00002.safetensors", "truncated"});
}

TEST_F(Shards, CorruptShardOrTargetStopsTheReaderBeforeTraining) {
  const std::string dir = write();
  const auto flip_byte = [](const fs::path& path) {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(fs::file_size(path) - 3));
    file.put('\x7f');
  };
  flip_byte(fs::path(dir) / "shard-00001.safetensors");
  expect_error_mentioning(
      [&] { ShardReader(dir, shard_layout(small_config().data, small_config().model)); },
      {"shard-00001.safetensors", "SHA-256", "corrupt"});
  const std::string other = (root_ / "other").string();
  write_into(other, ShardWriteOptions{5, 2, "fp32"});
  flip_byte(fs::path(other) / "target.safetensors");
  expect_error_mentioning(
      [&] { ShardReader(other, shard_layout(small_config().data, small_config().model)); },
      {"target.safetensors", "corrupt"});
}

TEST_F(Shards, Version1IndexWithoutChecksumsIsReadUnverified) {
  const std::string dir = write();
  const fs::path index_path = fs::path(dir) / "index.json";
  auto json = nlohmann::json::parse(std::ifstream(index_path));
  json["version"] = 1;
  json.erase("target");
  for (auto& shard : json["shards"]) {
    shard.erase("bytes");
    shard.erase("sha256");
  }
  std::ofstream(index_path) << json.dump();
  ShardReader reader(dir, shard_layout(small_config().data, small_config().model));
  EXPECT_FALSE(reader.index().target_digest.has_value());
  expect_batches_equal(reader.next(5), live_samples({0, 1, 2, 3, 4}));

  // A version 2 index must record them.
  json["version"] = 2;
  std::ofstream(index_path) << json.dump();
  expect_error_mentioning([&] { read_shard_index(dir); }, {"index.json", "shards[0]", "bytes"});
}

TEST_F(Shards, ShardWithWrongWidthIsNamed) {
  const std::string dir = write();
  const auto path = (fs::path(dir) / "shard-00000.safetensors").string();
  auto shard = core::load_safetensors(path);
  shard.tensors.at(2).second = torch::zeros({2, 10, 48});  // hidden_states with K = 3
  core::save_safetensors(path, shard.tensors, shard.metadata);
  expect_error_mentioning([&] { check_shard(core::load_safetensors(path), read_shard_index(dir), 0); },
                          {"shard-00000.safetensors", "hidden_states", "[2, 10, 48]", "[2, 10, 32]"});
}

// Replaces tensor `name` of `dir`/`file` by `value` and records the file's new size and SHA-256
// in index.json, so that only the check of the tensors can tell.
void replace_tensor(const std::string& dir, const std::string& file, const std::string& name,
                    const at::Tensor& value) {
  const std::string path = (fs::path(dir) / file).string();
  auto shard = core::load_safetensors(path);
  for (auto& [tensor_name, tensor] : shard.tensors) {
    if (tensor_name == name) tensor = value;
  }
  core::save_safetensors(path, shard.tensors, shard.metadata);
  const fs::path index_path = fs::path(dir) / "index.json";
  auto json = nlohmann::json::parse(std::ifstream(index_path));
  const core::FileDigest digest = core::digest_file(path);
  for (auto& entry : json["shards"]) {
    if (entry["file"] == file) entry.update({{"bytes", digest.bytes}, {"sha256", digest.sha256}});
  }
  std::ofstream(index_path) << json.dump();
}

TEST_F(Shards, BadTensorInAnyShardStopsTheReaderBeforeTheFirstBatch) {
  // The last shard (1 sample): a reader checking shards only when loaded would not see it
  // before next() reached sample 4.
  const std::vector<std::tuple<std::string, at::Tensor, std::vector<std::string>>> cases = {
      {"input_ids", torch::zeros({1, 10}, torch::kInt), {"'input_ids'", "dtype Int", "Long"}},
      {"hidden_states", torch::zeros({1, 10, 48}),
       {"'hidden_states'", "[1, 10, 48]", "[1, 10, 32]"}},
      {"loss_mask", torch::zeros({1, 9}, torch::kLong), {"'loss_mask'", "[1, 9]", "[1, 10]"}},
      {"input_ids", torch::full({1, 10}, 48, torch::kLong), {"input_ids", "vocabulary [0, 48)"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& [name, value, words] = cases[i];
    SCOPED_TRACE(name);
    const std::string dir = (root_ / fmt::format("case-{}", i)).string();
    write_into(dir, ShardWriteOptions{5, 2, "fp32"});
    replace_tensor(dir, "shard-00002.safetensors", name, value);
    std::vector<std::string> expected = words;
    expected.push_back("shard-00002.safetensors");
    expect_error_mentioning(
        [&] { ShardReader(dir, shard_layout(small_config().data, small_config().model)); },
        expected);
  }
}

TEST_F(Shards, BadTensorStopsTheReaderOfAVersion1IndexToo) {
  const std::string dir = write();
  replace_tensor(dir, "shard-00001.safetensors", "input_ids",
                 torch::full({2, 10}, -1, torch::kLong));
  const fs::path index_path = fs::path(dir) / "index.json";
  auto json = nlohmann::json::parse(std::ifstream(index_path));
  json["version"] = 1;
  std::ofstream(index_path) << json.dump();
  expect_error_mentioning(
      [&] { ShardReader(dir, shard_layout(small_config().data, small_config().model)); },
      {"shard-00001.safetensors", "input_ids", "vocabulary"});
}

TEST_F(Shards, MismatchedConfigIsRejected) {
  const std::string dir = write();
  auto layout = shard_layout(small_config().data, small_config().model);
  layout.hidden_size = 32;
  expect_error_mentioning([&] { ShardReader(dir, layout); },
                          {"index.json", "hidden_size 16", "model.hidden_size = 32"});
  layout = shard_layout(small_config().data, small_config().model);
  layout.target_layer_ids = {0, 1};
  expect_error_mentioning([&] { ShardReader(dir, layout); }, {"target_layer_ids"});
}

TEST_F(Shards, MissingOrBrokenIndexIsNamed) {
  expect_error_mentioning([&] { read_shard_index(root_.string()); }, {"index.json"});
  const std::string dir = write();
  std::ofstream(fs::path(dir) / "index.json") << "{\"format\": \"dspine-shards\", \"version\": 1}";
  expect_error_mentioning([&] { read_shard_index(dir); }, {"index.json", "seq_len"});
}

TEST_F(Shards, WriteRefusesAnExistingDirectory) {
  const std::string dir = write();
  expect_error_mentioning([&] { write_into(dir, ShardWriteOptions{1, 1, "fp32"}); },
                          {dir, "already exists"});
  EXPECT_THROW(write_into((root_ / "other").string(), ShardWriteOptions{1, 1, "fp16"}),
               Error);
  EXPECT_FALSE(fs::exists(root_ / "other"));
}

}  // namespace
}  // namespace dspine::data
