// The target depth a draft's config.json records (data/target_depth.h): the target's own
// config.json for real targets, the synthetic target's layers, or model.num_target_layers; a key
// that contradicts the target and layer ids past its depth are errors.
#include <fstream>

#include <gtest/gtest.h>

#include "common/expect_error.h"
#include "common/fresh_dir.h"
#include "core/config.h"
#include "data/target_depth.h"

namespace {

using dspine::core::Config;
using dspine::testing::expect_error_mentioning;

// A Qwen3-8B-deep target's config.json (tiny sizes): 36 decoder layers.
Config qwen3_8b_deep_target(dspine::core::DataSource source) {
  const auto dir = dspine::testing::fresh_dir("target_depth_" + dspine::core::to_string(source));
  std::ofstream(dir / "config.json")
      << R"({"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 36, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16, "vocab_size": 256})";
  Config config;
  config.data.source = source;
  config.data.target.path = dir.string();
  config.model.target_layer_ids = {1, 9, 17, 25, 33};
  return config;
}

TEST(TargetDepth, RealTargetsGiveTheirConfigsLayerCount) {
  for (const auto source :
       {dspine::core::DataSource::kTarget, dspine::core::DataSource::kSpecforge}) {
    Config config = qwen3_8b_deep_target(source);
    EXPECT_EQ(dspine::data::target_depth(config), 36)
        << dspine::core::to_string(source);  // not max(ids) + 1 = 34
    config.model.num_target_layers = 36;
    EXPECT_EQ(dspine::data::target_depth(config), 36) << dspine::core::to_string(source);
    config.model.num_target_layers = 34;
    expect_error_mentioning([&] { dspine::data::target_depth(config); },
                            {"model.num_target_layers = 34", "config.json gives 36 layers"});
  }
}

TEST(TargetDepth, LayerIdsPastTheTargetAreRefused) {
  Config config = qwen3_8b_deep_target(dspine::core::DataSource::kTarget);
  config.model.target_layer_ids = {1, 36};
  expect_error_mentioning([&] { dspine::data::target_depth(config); },
                          {"names layer 36", "the target has 36 layers", "config.json"});
}

TEST(TargetDepth, SyntheticTargetsGiveTheirLayersAndShardsTheKey) {
  Config config;  // synthetic, 4 layers, ids 0..2
  EXPECT_EQ(dspine::data::target_depth(config), 4);
  config.model.num_target_layers = 5;
  expect_error_mentioning([&] { dspine::data::target_depth(config); },
                          {"data.synthetic.num_layers gives 4"});
  config.data.source = dspine::core::DataSource::kShards;
  EXPECT_EQ(dspine::data::target_depth(config), 5);
  config.model.num_target_layers = 0;  // unknown: the least depth holding the ids, with a warning
  EXPECT_EQ(dspine::data::target_depth(config), 3);
  config.data.source =
      dspine::core::DataSource::kRandom;  // random values of the recipe's shapes: any depth goes
  config.model.target_layer_ids = {1, 9, 17, 25, 33};
  EXPECT_EQ(dspine::data::target_depth(config), 34);
  config.model.num_target_layers = 36;
  EXPECT_EQ(dspine::data::target_depth(config), 36);
}

}  // namespace
