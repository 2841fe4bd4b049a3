// The data-source registry (data/source_registry.h): one entry for every data.source, each naming
// the held-out key that core's validation ties to that source, and where it records the target's
// depth.
#include <gtest/gtest.h>

#include <string>

#include "core/config.h"
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

}  // namespace
