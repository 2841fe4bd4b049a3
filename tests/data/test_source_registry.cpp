// The data-source registry (data/source_registry.h): one entry for every data.source, each naming
// the held-out key that core's validation ties to that source, where it records the target's
// depth and special token ids; a missing data path is named with how to make it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "common/expect_error.h"
#include "core/config.h"
#include "core/files.h"
#include "data/batch_source.h"
#include "data/source_registry.h"

namespace {

using dspine::core::DataSource;
using dspine::data::data_source_entry;

TEST(SourceRegistry, EveryDataSourceHasItsEntry) {
  for (const auto& choice : dspine::core::choices_of(DataSource{})) {
    const auto& entry = data_source_entry(choice.value);
    EXPECT_EQ(entry.source, choice.value) << choice.name;
    EXPECT_NE(entry.make, nullptr) << choice.name;
    EXPECT_NE(entry.target_depth, nullptr) << choice.name;
    EXPECT_NE(entry.target_token_ids, nullptr) << choice.name;
    // A held-out key comes with the reader of its set.
    EXPECT_EQ(std::string(entry.held_out_key).empty(), entry.make_held_out == nullptr)
        << choice.name;
  }
}

// The keys core accepts only with their own source (core::validate's held-out keys).
TEST(SourceRegistry, HeldOutKeysAreTheSourcesOwn) {
  EXPECT_EQ(std::string(data_source_entry(DataSource::kTarget).held_out_key),
            "data.eval_samples_file");
  EXPECT_EQ(std::string(data_source_entry(DataSource::kShards).held_out_key),
            "data.eval_shards_dir");
  EXPECT_EQ(std::string(data_source_entry(DataSource::kSpecforge).held_out_key),
            "data.eval_specforge_dir");
  EXPECT_EQ(std::string(data_source_entry(DataSource::kSynthetic).held_out_key), "");
  EXPECT_EQ(std::string(data_source_entry(DataSource::kRandom).held_out_key), "");
}

TEST(SourceRegistry, DepthIsRecordedWhereTheSourceKeepsIt) {
  dspine::core::Config config;
  config.data.synthetic.num_layers = 7;
  const auto synthetic = data_source_entry(DataSource::kSynthetic).target_depth(config);
  EXPECT_EQ(synthetic.depth, 7);
  EXPECT_EQ(synthetic.origin, "data.synthetic.num_layers");
  EXPECT_EQ(data_source_entry(DataSource::kShards).target_depth(config).depth, 0);
  EXPECT_EQ(data_source_entry(DataSource::kRandom).target_depth(config).depth, 0);
  EXPECT_TRUE(data_source_entry(DataSource::kRandom).stands_in_for_any_target);
  EXPECT_FALSE(data_source_entry(DataSource::kShards).stands_in_for_any_target);
}

// A target's config.json records its special tokens (the testbed's BOS 256 and EOS 257); sources
// without one record none.
TEST(SourceRegistry, TokenIdsComeFromTheTargetsConfig) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("dspine_test_token_ids_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"bos_token_id": 256, "eos_token_id": [257, 258]})";
  dspine::core::Config config;
  config.data.target.path = dir.string();
  for (const auto source : {DataSource::kTarget, DataSource::kSpecforge}) {
    const auto ids = data_source_entry(source).target_token_ids(config);
    EXPECT_EQ(ids.bos_token_id, 256);
    EXPECT_EQ(ids.eos_token_id, nlohmann::json({257, 258}));
  }
  for (const auto source : {DataSource::kSynthetic, DataSource::kShards, DataSource::kRandom}) {
    EXPECT_TRUE(data_source_entry(source).target_token_ids(config).bos_token_id.is_null());
  }
  dspine::core::remove_tree(dir.string());
}

// A missing target or samples path stops the source before anything is loaded, naming the key,
// the path and how it is made: the testbed's command for a testbed path.
TEST(SourceRegistry, MissingDataPathsSayHowToMakeThem) {
  const auto root = std::filesystem::temp_directory_path() /
                    ("dspine_test_missing_" + std::to_string(::getpid()));
  dspine::core::Config config;
  config.data.source = DataSource::kTarget;
  config.data.target.path = (root / "data/testbed-gpu/target").string();
  const auto make = data_source_entry(DataSource::kTarget).make;
  using dspine::testing::expect_error_mentioning;
  expect_error_mentioning([&] { make(config, c10::Device(c10::kCPU)); },
                          {"data.target.path " + config.data.target.path,
                           "python3 scripts/make_testbed_target.py --size gpu --out " +
                               (root / "data/testbed-gpu").string()});
  const auto make_specforge = data_source_entry(DataSource::kSpecforge).make;
  expect_error_mentioning([&] { make_specforge(config, c10::Device(c10::kCPU)); },
                          {"data.target.path", "make_testbed_target.py --size gpu"});
  config.data.target.path = root.string();
  std::filesystem::create_directories(root);
  config.data.samples = (root / "chats.jsonl").string();
  expect_error_mentioning([&] { make(config, c10::Device(c10::kCPU)); },
                          {"data.samples " + config.data.samples, "scripts/prepare_data.py"});
  dspine::core::remove_tree(root.string());
}

}  // namespace
