// The draft's Hugging Face layout (docs/model.md#export-and-import): the state layout computed
// from the configuration equals the module's, config.json reads back into the same model
// configuration (RoPE in transformers 5's layout or the older one), a config.json of another
// draft is refused naming each differing key with both values, and load_draft takes the
// transfer space from the file without rebuilding it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/dspine_tiny.h"
#include "common/expect_error.h"
#include "common/fresh_dir.h"
#include "common/parity.h"
#include "core/safetensors.h"
#include "model/draft_loading.h"
#include "model/dspine_config.h"
#include "model/dspine_draft.h"
#include "model/hf_draft_config.h"
#include "model/module_state.h"
#include "model/state_layout.h"

namespace dspine::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::expect_error;
using testing::expect_error_mentioning;
using testing::expect_same_state;
using testing::fresh_dir;

DSpineModelConfig tiny_config() { return testing::tiny_model_config(); }

json tiny_hf_config() {
  return dspine_hf_config(tiny_config(),
                          HfConfigContext{core::Dtype::kFp32, {{"ce_weight", 0.25}}, 8, 12});
}

// A draft directory as an export holds it: config.json and model.safetensors.
void write_draft_dir(const fs::path& dir, DSpineDraftImpl& draft, const json& config) {
  core::save_safetensors((dir / "model.safetensors").string(), module_state(draft));
  std::ofstream(dir / "config.json") << config.dump(2);
}

TEST(StateLayout, EqualsTheModulesParametersAndBuffersInOrder) {
  DSpineDraft draft(tiny_config(), false);
  const auto state = module_state(*draft);
  const auto layout = dspine_state_layout(tiny_config());
  ASSERT_EQ(layout.size(), state.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    EXPECT_EQ(layout[i].name, state[i].first) << i;
    EXPECT_EQ(at::IntArrayRef(layout[i].shape), state[i].second.sizes()) << layout[i].name;
  }
  EXPECT_EQ(layout.back().name, "transfer_ready");
  EXPECT_TRUE(layout.back().shape.empty());
}

TEST(HfDraftConfig, ReadsBackTheModelConfigItWasWrittenFrom) {
  const auto c = model_config_from_hf(tiny_hf_config(), "config.json");
  const auto expected = tiny_config();
  EXPECT_EQ(c.architecture, "dspine");
  EXPECT_EQ(c.hidden_size, expected.hidden_size);
  EXPECT_EQ(c.intermediate_size, expected.intermediate_size);
  EXPECT_EQ(c.num_hidden_layers, expected.num_hidden_layers);
  EXPECT_EQ(c.num_attention_heads, expected.num_attention_heads);
  EXPECT_EQ(c.num_key_value_heads, expected.num_key_value_heads);
  EXPECT_EQ(c.head_dim, expected.head_dim);
  EXPECT_EQ(c.vocab_size, expected.vocab_size);
  EXPECT_EQ(c.rms_norm_eps, expected.rms_norm_eps);
  EXPECT_EQ(c.rope_theta, expected.rope_theta);
  EXPECT_EQ(c.initializer_range, expected.initializer_range);
  EXPECT_EQ(c.block_size, expected.block_size);
  EXPECT_EQ(c.mask_token_id, expected.mask_token_id);
  EXPECT_EQ(c.target_layer_ids, expected.target_layer_ids);
  EXPECT_EQ(c.dspine.transfer_rank, expected.dspine.transfer_rank);
  EXPECT_EQ(c.dspine.message_size, expected.dspine.message_size);
  EXPECT_EQ(c.dspine.top_k, expected.dspine.top_k);
  EXPECT_EQ(c.dspine.replacement_layers, expected.dspine.replacement_layers);
  EXPECT_NO_THROW(check_hf_config(tiny_hf_config(), tiny_config(), "config.json"));
}

// The reference's fallbacks: block_size only in dflash_config, dspine_config absent (defaults),
// is_causal null.
TEST(HfDraftConfig, AcceptsTheReferenceFallbacks) {
  auto hf = tiny_hf_config();
  hf.erase("block_size");
  hf["is_causal"] = nullptr;
  hf["dspine_config"] = {{"transfer_rank", 8}, {"message_size", 4}, {"top_k", 3}};
  const auto c = model_config_from_hf(hf, "config.json");
  EXPECT_EQ(c.block_size, 4);
  EXPECT_EQ(c.dspine.replacement_layers, DSpineConfig{}.replacement_layers);
}

TEST(HfDraftConfig, RefusesWhatTheDraftDoesNotImplementNamingTheKey) {
  auto with = [](const std::string& pointer, const json& value) {
    auto hf = tiny_hf_config();
    hf[json::json_pointer(pointer)] = value;
    return hf;
  };
  expect_error([&] { model_config_from_hf(with("/architectures", {"LlamaForCausalLM"}), "c.json"); },
               "c.json: architectures");
  expect_error([&] { model_config_from_hf(with("/model_type", "llama"), "c.json"); }, "model_type");
  expect_error([&] { model_config_from_hf(with("/is_causal", false), "c.json"); },
               "DSpine requires causal attention");
  expect_error([&] { model_config_from_hf(with("/is_causal", "false"), "c.json"); },
               "is_causal must be a boolean or null");
  expect_error([&] { model_config_from_hf(with("/attention_bias", true), "c.json"); },
               "attention_bias");
  expect_error([&] {
    model_config_from_hf(with("/layer_types/1", "sliding_attention"), "c.json");
  }, "sliding_attention");
  expect_error([&] {
    model_config_from_hf(with("/layer_types", {"full_attention"}), "c.json");
  }, "layer_types has 1 entries, num_hidden_layers is 3");
  expect_error_mentioning([&] { model_config_from_hf(with("/hidden_size", 16.5), "c.json"); },
                          {"c.json", "hidden_size must be an integer", "16.5"});
  expect_error([&] { model_config_from_hf(with("/dspine_config/top_k", true), "c.json"); },
               "dspine_config.top_k must be an integer");
  expect_error_mentioning([&] {
    model_config_from_hf(with("/dspine_config/transfer_rank", 17), "c.json");
  }, {"c.json", "DSpine transfer_rank"});
  expect_error_mentioning([&] { model_config_from_hf(with("/vocab_size", 1ull << 40), "c.json"); },
                          {"c.json", "vocab_size is 1099511627776, beyond any draft's sizes"});
  expect_error([&] { model_config_from_hf(with("/layer_types", nullptr), "c.json"); },
               "layer_types must be a list with one entry per layer");
  auto missing = tiny_hf_config();
  missing.erase("vocab_size");
  expect_error([&] { model_config_from_hf(missing, "c.json"); }, "c.json: has no key vocab_size");
}

// The export writes RoPE as transformers 5 does (rope_parameters) and as older readers expect
// (a top-level rope_theta), without the deprecated rope_scaling; either layout alone reads back,
// and so does an older export's null rope_scaling.
TEST(HfDraftConfig, WritesRopeParametersAndReadsEitherLayout) {
  auto c = tiny_config();
  c.rope_theta = 5e5;
  const json hf = dspine_hf_config(c, HfConfigContext{core::Dtype::kFp32, json::object(), 8, 12});
  EXPECT_EQ(hf.at("rope_parameters"), json({{"rope_theta", 5e5}, {"rope_type", "default"}}));
  EXPECT_EQ(hf.at("rope_theta"), 5e5);
  EXPECT_FALSE(hf.contains("rope_scaling"));

  auto transformers5 = hf;  // as transformers 5 saves it
  transformers5.erase("rope_theta");
  auto transformers4 = hf;
  transformers4.erase("rope_parameters");
  transformers4["rope_scaling"] = nullptr;
  for (const json& layout : {transformers5, transformers4}) {
    EXPECT_EQ(model_config_from_hf(layout, "config.json").rope_theta, 5e5);
    EXPECT_NO_THROW(check_hf_config(layout, c, "config.json"));
    // A run with another base is told apart whichever layout holds it.
    expect_error_mentioning(
        [&] { check_hf_config(layout, tiny_config(), "d/config.json"); },
        {"d/config.json", "rope_parameters.rope_theta is 500000.0, the run's model has 10000.0"});
  }
}

TEST(HfDraftConfig, RefusesDisagreeingOrScaledRope) {
  auto hf = tiny_hf_config();
  hf["rope_parameters"]["rope_theta"] = 1e6;
  expect_error_mentioning([&] { model_config_from_hf(hf, "c.json"); },
                          {"c.json", "rope_theta is 10000.0 but rope_parameters.rope_theta is "
                                     "1000000.0; they must agree"});
  hf = tiny_hf_config();
  hf["rope_parameters"]["rope_type"] = "yarn";
  expect_error_mentioning([&] { model_config_from_hf(hf, "c.json"); },
                          {"c.json", "rope_parameters.rope_type is \"yarn\"", "plain"});
  hf = tiny_hf_config();
  hf["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  expect_error_mentioning([&] { model_config_from_hf(hf, "c.json"); },
                          {"c.json", "rope_scaling.type is \"linear\""});
  hf = tiny_hf_config();
  hf["rope_parameters"] = 1e4;
  expect_error([&] { model_config_from_hf(hf, "c.json"); },
               "rope_parameters must be an object or null");
}

TEST(HfDraftConfig, AnotherDraftIsNamedKeyByKeyWithBothValues) {
  auto run = tiny_config();
  run.hidden_size = 32;
  run.dspine.top_k = 5;
  run.target_layer_ids = {1, 4, 7};
  expect_error_mentioning([&] { check_hf_config(tiny_hf_config(), run, "d/config.json"); },
                          {"d/config.json", "hidden_size is 16, the run's model has 32",
                           "dspine_config.top_k is 3, the run's model has 5",
                           "dflash_config.target_layer_ids is [1,4,6], the run's model has [1,4,7]"});
  // Training-only keys may differ.
  auto hf = tiny_hf_config();
  hf["initializer_range"] = 0.5;
  hf["dtype"] = "bfloat16";
  hf["dspine_config"]["ce_weight"] = 0.75;
  EXPECT_NO_THROW(check_hf_config(hf, tiny_config(), "config.json"));
}

TEST(LoadDraft, TakesWeightsAndTransferSpaceFromTheDirectory) {
  const auto dir = fresh_dir("load_draft");
  torch::manual_seed(3);
  DSpineDraft saved(tiny_config(), false);
  saved->initialize_transfer_space(torch::randn({32, 16}));
  write_draft_dir(dir, *saved, tiny_hf_config());

  torch::manual_seed(4);
  DSpineDraft loaded(tiny_config(), false);
  load_draft(*loaded, dir.string());
  expect_same_state(module_state(*loaded), module_state(*saved));
  EXPECT_TRUE(loaded->transfer_ready());

  auto other = tiny_config();
  other.dspine.top_k = 4;  // same shapes: only config.json tells the drafts apart
  DSpineDraft mismatched(other, false);
  expect_error_mentioning([&] { load_draft(*mismatched, dir.string()); },
                          {(dir / "config.json").string(), "dspine_config.top_k is 3"});
}

TEST(LoadDraft, RefusesADraftWhoseTransferSpaceWasNeverBuilt) {
  const auto dir = fresh_dir("load_unready");
  DSpineDraft fresh(tiny_config(), false);
  write_draft_dir(dir, *fresh, tiny_hf_config());
  DSpineDraft target(tiny_config(), false);
  expect_error_mentioning([&] { load_draft(*target, dir.string()); },
                          {"model.safetensors", "transfer_ready is false"});
}

}  // namespace
}  // namespace dspine::model
