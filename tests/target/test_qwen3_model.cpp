// Qwen3Model against Hugging Face transformers: the tiny models and expected outputs written by
// tests/target/make_tiny_qwen3.py (the ctest fixture make_tiny_qwen3) into DSPINE_TINY_QWEN3_DIR,
// among them RoPE of base 1e6 and YaRN in transformers 5's config layout; and config.json's RoPE
// settings in both layouts, with what is refused.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/expect_error.h"
#include "common/fresh_dir.h"
#include "common/parity.h"
#include "core/error.h"
#include "core/files.h"
#include "core/safetensors.h"
#include "target/hf_checkpoint.h"
#include "target/qwen3_model.h"

namespace dspine::target {
namespace {

namespace fs = std::filesystem;

const c10::Device kCpu(c10::kCPU);

std::string tiny_dir(const std::string& name) {
  const fs::path dir = fs::path(DSPINE_TINY_QWEN3_DIR) / name;
  if (!fs::exists(dir / "expected.safetensors")) {
    ADD_FAILURE() << dir << " is missing: run the ctest fixture make_tiny_qwen3 first "
                  << "(python tests/target/make_tiny_qwen3.py " << DSPINE_TINY_QWEN3_DIR << ")";
  }
  return dir.string();
}

std::vector<int64_t> layer_ids_of(const core::SafetensorsFile& expected) {
  const auto ids = expected.at("layer_ids").contiguous();
  return {ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel()};
}

// Differences are measured relative to the reference's scale (its largest magnitude, at least 1:
// testing::expect_close, max_relative_diff with floor 1): fp32 rounding grows with the values,
// and the residual stream reaches ~40 here.
using testing::expect_close;

class HuggingFaceParity : public ::testing::TestWithParam<std::string> {};

TEST_P(HuggingFaceParity, HiddenStatesLastStateAndLogitsMatchTransformersInFp32) {
  const std::string dir = tiny_dir(GetParam());
  const auto expected = core::load_safetensors(dir + "/expected.safetensors");
  const Qwen3Model model = Qwen3Model::load_hf(dir, torch::kFloat, kCpu);
  const auto out = model.forward(expected.at("input_ids"), layer_ids_of(expected));
  expect_close(out.hidden_states, expected.at("hidden_states"), 1e-5, "hidden_states");
  expect_close(out.last_hidden_state, expected.at("last_hidden_state"), 1e-5, "last_hidden_state");
  expect_close(model.logits(out.last_hidden_state), expected.at("logits"), 1e-5, "logits");
  // The comparison means something only if the states are not tiny.
  EXPECT_GT(expected.at("last_hidden_state").abs().mean().item<double>(), 0.1);
}

TEST_P(HuggingFaceParity, HeadIsTheEmbeddingStorageExactlyWhenTied) {
  const Qwen3Model model = Qwen3Model::load_hf(tiny_dir(GetParam()), torch::kFloat, kCpu);
  const bool tied = GetParam().rfind("tied", 0) == 0;
  EXPECT_EQ(model.dims().tie_word_embeddings, tied);
  EXPECT_EQ(model.lm_head().is_same(model.embed_tokens()), tied);
  EXPECT_EQ(model.embed_tokens().sizes(), torch::IntArrayRef({96, 32}));
}

INSTANTIATE_TEST_SUITE_P(TinyModels, HuggingFaceParity,
                         ::testing::Values("tied-single", "untied-single", "tied-sharded",
                                           "untied-sharded", "rope-theta", "yarn", "yarn-ramp"),
                         [](const auto& info) {
                           std::string name = info.param;
                           name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
                           return name;
                         });

TEST(Qwen3Model, Bf16ForwardStaysCloseToFp32) {
  const std::string dir = tiny_dir("untied-single");
  const auto expected = core::load_safetensors(dir + "/expected.safetensors");
  const Qwen3Model model = Qwen3Model::load_hf(dir, torch::kBFloat16, kCpu);
  const auto out = model.forward(expected.at("input_ids"), layer_ids_of(expected));
  EXPECT_EQ(out.last_hidden_state.scalar_type(), torch::kBFloat16);
  const auto reference = expected.at("last_hidden_state");
  expect_close(out.last_hidden_state, reference, 0.1 * reference.abs().max().item<double>(),
               "bf16 last_hidden_state");
}

TEST(Qwen3Model, CachedStepsEqualTheFullForward) {
  const std::string dir = tiny_dir("untied-single");
  const auto expected = core::load_safetensors(dir + "/expected.safetensors");
  const Qwen3Model model = Qwen3Model::load_hf(dir, torch::kFloat, kCpu);
  const auto ids = expected.at("input_ids");  // [2, 11]
  const auto layers = layer_ids_of(expected);
  const auto full = model.forward(ids, layers);

  // A prompt of 4, one token at a time up to 8, then the last 3 at once (attention with an
  // offset causal mask over the cache).
  auto cache = model.new_cache(2, 11);
  std::vector<torch::Tensor> hidden, last;
  const auto take = [&](int64_t start, int64_t count) {
    const auto out = model.step(ids.narrow(1, start, count), cache, layers);
    hidden.push_back(out.hidden_states);
    last.push_back(out.last_hidden_state);
  };
  take(0, 4);
  for (int64_t t = 4; t < 8; ++t) take(t, 1);
  take(8, 3);
  EXPECT_EQ(cache.length, 11);
  expect_close(torch::cat(hidden, 1), full.hidden_states, 1e-5, "cached hidden_states");
  expect_close(torch::cat(last, 1), full.last_hidden_state, 1e-5, "cached last_hidden_state");
  EXPECT_THROW(model.step(ids.narrow(1, 0, 1), cache), Error);  // the cache is full
}

// Rows at their own positions (Qwen3Model::step_rows, batched speculative decoding): rows that
// cache different lengths, then take blocks at once, equal forward() over each row's own sequence;
// what a row wrote past the length it keeps is overwritten by its next block.
TEST(Qwen3Model, RowsAtTheirOwnPositionsEqualTheFullForward) {
  for (const char* name : {"untied-single", "yarn-ramp"}) {
    const std::string dir = tiny_dir(name);
    const auto expected = core::load_safetensors(dir + "/expected.safetensors");
    const Qwen3Model model = Qwen3Model::load_hf(dir, torch::kFloat, kCpu);
    const auto ids = expected.at("input_ids");
    const auto layers = layer_ids_of(expected);
    const int64_t length = ids.size(1);
    const auto full = model.forward(ids, layers);
    auto cache = model.new_cache(2, length + 2);
    // Row 0 caches 3 tokens, row 1 caches 5 (a prefill of 5, row 0's last two not kept).
    model.step_rows(ids.narrow(1, 0, 5), cache, {0, 0}, layers);
    std::vector<int64_t> lengths = {3, 5};
    // A block of 4 of each row's own next tokens: row 0 positions 3..6, row 1 positions 5..8.
    const auto block = torch::stack({ids[0].narrow(0, 3, 4), ids[1].narrow(0, 5, 4)});
    const auto out = model.step_rows(block, cache, lengths, layers);
    for (int64_t r = 0; r < 2; ++r) {
      const auto want = full.last_hidden_state[r].narrow(0, lengths[r], 4);
      expect_close(out.last_hidden_state[r], want, 1e-5, fmt::format("{} row {}", name, r));
      expect_close(out.hidden_states[r], full.hidden_states[r].narrow(0, lengths[r], 4), 1e-5,
                   fmt::format("{} row {} layers", name, r));
    }
    // Row 0 keeps 2 of its 4 (length 5), row 1 keeps 1 (length 6); one more token each.
    lengths = {5, 6};
    const auto next = torch::stack({ids[0].narrow(0, 5, 1), ids[1].narrow(0, 6, 1)});
    const auto one = model.step_rows(next, cache, lengths, layers);
    for (int64_t r = 0; r < 2; ++r) {
      expect_close(one.last_hidden_state[r], full.last_hidden_state[r].narrow(0, lengths[r], 1),
                   1e-5, fmt::format("{} row {} after a partial keep", name, r));
    }
    // The device form (spans of lengths as a tensor), attending over the whole capacity, masked:
    // what a CUDA graph of a decoding round runs.
    const auto spans =
        core::row_spans(torch::tensor(lengths), 1, length + 2, model.embed_tokens().scalar_type());
    const auto wide = model.step_rows(next, cache, spans, layers);
    expect_close(wide.last_hidden_state, one.last_hidden_state, 1e-6,
                 fmt::format("{} over the whole capacity", name));
    expect_close(wide.hidden_states, one.hidden_states, 1e-6, fmt::format("{} layers", name));
    EXPECT_EQ(cache.length, 0);  // step_rows leaves the shared length alone
    EXPECT_THROW(model.step_rows(next, cache, {length + 2, 0}), Error);  // past the capacity
    EXPECT_THROW(model.step_rows(next, cache, {1}), Error);              // one length for two rows
  }
}

// Branches of a cached context (Qwen3Model::branch) against forward() over each context prefix
// followed by its block, for plain RoPE and YaRN: blocks at the first and the last cached
// position, several per row, rows with different branches.
TEST(Qwen3Model, BranchesOfTheCacheEqualTheFullForward) {
  for (const char* name : {"untied-single", "yarn-ramp"}) {
    const std::string dir = tiny_dir(name);
    const auto expected = core::load_safetensors(dir + "/expected.safetensors");
    const Qwen3Model model = Qwen3Model::load_hf(dir, torch::kFloat, kCpu);
    const auto ids = expected.at("input_ids");
    const int64_t rows = ids.size(0), length = ids.size(1), block = 3;
    const int64_t vocab = model.dims().vocab_size;
    auto cache = model.new_cache(rows, length);
    model.step(ids, cache);
    torch::manual_seed(2);
    const auto drafted = torch::randint(0, vocab, {rows, 3, block}, torch::kInt64);
    const std::vector<int64_t> lengths = {1, length, 4, length, 2, 2};
    const auto context = torch::tensor(lengths, torch::kInt64).view({2, 3}).narrow(0, 0, rows);
    const auto states = model.branch(drafted, context, cache);  // [B, 3, block, H]
    ASSERT_EQ(states.sizes(), (std::vector<int64_t>{rows, 3, block, model.dims().hidden_size}));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t n = 0; n < 3; ++n) {
        const int64_t prefix = context[r][n].item<int64_t>();
        const auto sequence = torch::cat({ids[r].narrow(0, 0, prefix), drafted[r][n]}).unsqueeze(0);
        const auto full = model.forward(sequence, {}).last_hidden_state[0].narrow(0, prefix, block);
        expect_close(states[r][n], full, 1e-5, fmt::format("{} row {} block {}", name, r, n));
      }
    }
    const auto bad = torch::full({rows, 3}, length + 1, torch::kInt64);
    EXPECT_THROW(model.branch(drafted, bad, cache), Error);  // past the cached positions
  }
}

TEST(Qwen3Model, RandomWeightsAreAPureFunctionOfTheSeed) {
  Qwen3Dims dims{32, 48, 2, 4, 2, 8, 50, 1e-6, 1e4, false};
  const auto a = Qwen3Model::random(dims, 7, torch::kFloat, kCpu);
  const auto b = Qwen3Model::random(dims, 7, torch::kFloat, kCpu);
  const auto c = Qwen3Model::random(dims, 8, torch::kFloat, kCpu);
  const auto ids = torch::randint(50, {2, 6}, torch::kLong);
  EXPECT_TRUE(torch::equal(a.forward(ids, {1}).hidden_states, b.forward(ids, {1}).hidden_states));
  EXPECT_FALSE(torch::equal(a.lm_head(), c.lm_head()));
  dims.tie_word_embeddings = true;
  const auto tied = Qwen3Model::random(dims, 7, torch::kFloat, kCpu);
  EXPECT_TRUE(tied.lm_head().is_same(tied.embed_tokens()));
}

TEST(Qwen3Model, RejectsLayerIdsAndTokenIdsOutOfRange) {
  const Qwen3Dims dims{32, 48, 2, 4, 2, 8, 50, 1e-6, 1e4, false};
  const auto model = Qwen3Model::random(dims, 1, torch::kFloat, kCpu);
  EXPECT_THROW(model.forward(torch::zeros({1, 3}, torch::kLong), {2}), Error);
  EXPECT_THROW(model.forward(torch::full({1, 3}, 50, torch::kLong), {0}), Error);
  EXPECT_THROW(model.forward(torch::zeros({3}, torch::kLong), {0}), Error);
}

nlohmann::json read_json(const std::string& path) {
  return nlohmann::json::parse(std::ifstream(path));
}

// The RoPE models' config.json is transformers 5's own: the settings only in rope_parameters, so
// their parity above shows that layout is read.
TEST(Qwen3Rope, TransformersFiveConfigsAreReadFromRopeParameters) {
  for (const char* name : {"rope-theta", "yarn", "yarn-ramp"}) {
    const auto config = read_json(tiny_dir(name) + "/config.json");
    EXPECT_FALSE(config.contains("rope_theta")) << name;
    EXPECT_FALSE(config.contains("rope_scaling")) << name;
    EXPECT_TRUE(config.at("rope_parameters").contains("rope_theta")) << name;
  }
  const Qwen3Dims plain = read_qwen3_config(tiny_dir("rope-theta") + "/config.json");
  EXPECT_EQ(plain.rope_theta, 1e6);
  EXPECT_EQ(plain.rope.type, Qwen3Rope::Type::kDefault);

  const Qwen3Dims yarn = read_qwen3_config(tiny_dir("yarn") + "/config.json");
  EXPECT_EQ(yarn.rope_theta, 1e6);
  EXPECT_EQ(yarn.rope.type, Qwen3Rope::Type::kYarn);
  EXPECT_EQ(yarn.rope.factor, 4.0);
  EXPECT_EQ(yarn.rope.original_max_position_embeddings, 16);
  EXPECT_EQ(yarn.rope.attention_factor, 0.1 * std::log(4.0) + 1.0);
  EXPECT_EQ(yarn.rope.beta_fast, 32.0);
  EXPECT_EQ(yarn.rope.beta_slow, 1.0);
  EXPECT_TRUE(yarn.rope.truncate);

  const Qwen3Dims ramp = read_qwen3_config(tiny_dir("yarn-ramp") + "/config.json");
  EXPECT_EQ(ramp.rope_theta, 1e4);
  EXPECT_EQ(ramp.rope.factor, 4.0);  // null: max_position_embeddings 64 / 16
  EXPECT_EQ(ramp.rope.attention_factor,
            (0.1 * 2.0 * std::log(4.0) + 1.0) / (0.1 * 1.0 * std::log(4.0) + 1.0));
  EXPECT_EQ(ramp.rope.beta_fast, 4.0);
  EXPECT_EQ(ramp.rope.beta_slow, 0.25);
  EXPECT_FALSE(ramp.rope.truncate);
}

// The parity tests can fail: the same weights under plain RoPE of base 1e4 (what rope-theta's
// config read as before rope_parameters was understood), or under YaRN's base without its
// scaling, give hidden states far from transformers'.
TEST(Qwen3Rope, TheSettingsChangeTheHiddenStates) {
  for (const char* name : {"rope-theta", "yarn", "yarn-ramp"}) {
    const std::string dir = tiny_dir(name);
    const auto expected = core::load_safetensors(dir + "/expected.safetensors");
    Qwen3Dims plain = read_qwen3_config(dir + "/config.json");
    if (plain.rope.type == Qwen3Rope::Type::kDefault) plain.rope_theta = 1e4;
    plain.rope = Qwen3Rope{};
    const auto model =
        Qwen3Model::from_weights(plain, read_hf_weights(dir), torch::kFloat, kCpu, dir);
    const auto out = model.forward(expected.at("input_ids"), layer_ids_of(expected));
    EXPECT_EQ(out.hidden_states.sizes(), expected.at("hidden_states").sizes()) << name;
    EXPECT_GT(testing::max_relative_diff(out.hidden_states, expected.at("hidden_states"), 1.0),
              1e-3)
        << name;
  }
}

// config.json's RoPE settings, without weights: a minimal Qwen3 config with `edit` applied,
// written to a scratch directory and read back.
class RopeConfig : public ::testing::Test {
 protected:
  static nlohmann::json minimal() {
    return {{"model_type", "qwen3"},  {"hidden_size", 32},        {"intermediate_size", 48},
            {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
            {"head_dim", 8},          {"vocab_size", 96},         {"max_position_embeddings", 64}};
  }

  Qwen3Dims read(const nlohmann::json& config) {
    std::ofstream(path_) << config.dump(2);
    return read_qwen3_config(path_);
  }

  Qwen3Dims read(const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json config = minimal();
    edit(config);
    return read(config);
  }

  // Reading the config with `edit` applied throws naming config.json and every one of `parts`.
  void expect_refused(const std::function<void(nlohmann::json&)>& edit,
                      std::vector<std::string> parts) {
    parts.insert(parts.begin(), path_);
    dspine::testing::expect_error_mentioning([&] { read(edit); }, parts);
  }

  static void expect_same(const Qwen3Dims& a, const Qwen3Dims& b) {
    EXPECT_EQ(a.rope_theta, b.rope_theta);
    EXPECT_EQ(a.rope.type, b.rope.type);
    EXPECT_EQ(a.rope.factor, b.rope.factor);
    EXPECT_EQ(a.rope.attention_factor, b.rope.attention_factor);
    EXPECT_EQ(a.rope.beta_fast, b.rope.beta_fast);
    EXPECT_EQ(a.rope.beta_slow, b.rope.beta_slow);
    EXPECT_EQ(a.rope.truncate, b.rope.truncate);
    EXPECT_EQ(a.rope.original_max_position_embeddings, b.rope.original_max_position_embeddings);
  }

  std::string path_ = (dspine::testing::fresh_dir("rope_config") / "config.json").string();
};

TEST_F(RopeConfig, ThetaFromEitherLayout) {
  EXPECT_EQ(read(minimal()).rope_theta, 1e4);  // Qwen3Config's default
  EXPECT_EQ(read([](auto& j) { j["rope_theta"] = 1e6; }).rope_theta, 1e6);
  EXPECT_EQ(read([](auto& j) { j["rope_parameters"] = {{"rope_theta", 1e6}}; }).rope_theta, 1e6);
  // A top-level rope_theta fills in for a dictionary without one, as in transformers 5.
  const Qwen3Dims both = read([](auto& j) {
    j["rope_theta"] = 5e5;
    j["rope_scaling"] = nullptr;
    j["rope_parameters"] = {{"rope_type", "default"}};
  });
  EXPECT_EQ(both.rope_theta, 5e5);
  EXPECT_EQ(both.rope.type, Qwen3Rope::Type::kDefault);
  EXPECT_EQ(read([](auto& j) {
              j["rope_theta"] = 1e6;
              j["rope_parameters"] = {{"rope_theta", 1e6}, {"rope_type", "default"}};
            }).rope_theta,
            1e6);
}

// The transformers 4 layout (top-level rope_theta, rope_scaling with the legacy "type") reads as
// its transformers 5 equivalent.
TEST_F(RopeConfig, TransformersFourLayoutReadsAsItsTransformersFiveEquivalent) {
  auto legacy = minimal();
  legacy["rope_theta"] = 1e6;
  legacy["rope_scaling"] = {{"type", "yarn"},
                            {"factor", 4.0},
                            {"original_max_position_embeddings", 16},
                            {"beta_fast", 8}};
  auto current = minimal();
  current["rope_parameters"] = {{"rope_type", "yarn"},
                                {"rope_theta", 1e6},
                                {"factor", 4.0},
                                {"original_max_position_embeddings", 16},
                                {"beta_fast", 8}};
  const Qwen3Dims a = read(legacy), b = read(current);
  EXPECT_EQ(b.rope.type, Qwen3Rope::Type::kYarn);
  EXPECT_EQ(b.rope.beta_fast, 8.0);
  expect_same(a, b);

  legacy["rope_scaling"] = nullptr;  // plain RoPE in transformers 4
  current["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  expect_same(read(legacy), read(current));
  // Both layouts at once, agreeing, as a file edited across versions may hold them.
  legacy["rope_parameters"] = current["rope_parameters"];
  expect_same(read(legacy), read(current));
}

// YaRN's defaults and fallbacks, as transformers 5 resolves them.
TEST_F(RopeConfig, YarnFallbacksAsTransformers) {
  const auto yarn = [](nlohmann::json extra) {
    return [extra](nlohmann::json& j) {
      j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 2.0}};
      j["rope_parameters"].update(extra);
    };
  };
  const Qwen3Dims plain = read(yarn(nlohmann::json::object()));
  EXPECT_EQ(plain.rope.original_max_position_embeddings, 64);  // max_position_embeddings
  EXPECT_EQ(plain.rope.attention_factor, 0.1 * std::log(2.0) + 1.0);
  EXPECT_TRUE(plain.rope.truncate);
  EXPECT_EQ(read([&](auto& j) {
              yarn(nlohmann::json::object())(j);
              j.erase("max_position_embeddings");
            }).rope.original_max_position_embeddings,
            32768);  // Qwen3Config's max_position_embeddings
  EXPECT_EQ(read(yarn({{"factor", nullptr}, {"original_max_position_embeddings", 8}})).rope.factor,
            8.0);
  // A top-level original_max_position_embeddings wins over the dictionary's.
  EXPECT_EQ(read([&](auto& j) {
              yarn({{"original_max_position_embeddings", 8}})(j);
              j["original_max_position_embeddings"] = 32;
            }).rope.original_max_position_embeddings,
            32);
  EXPECT_EQ(read(yarn({{"attention_factor", 1.5}, {"mscale", 3.0}})).rope.attention_factor, 1.5);
  // mscale counts only together with mscale_all_dim.
  EXPECT_EQ(read(yarn({{"mscale", 3.0}})).rope.attention_factor, 0.1 * std::log(2.0) + 1.0);
  EXPECT_EQ(read(yarn({{"factor", 0.5}})).rope.attention_factor, 1.0);
  EXPECT_FALSE(read(yarn({{"truncate", nullptr}})).rope.truncate);  // transformers: None is false
  EXPECT_EQ(read(yarn({{"beta_fast", nullptr}})).rope.beta_fast, 32.0);
}

TEST_F(RopeConfig, RefusesUnsupportedRopeNamingFileAndKey) {
  for (const char* type : {"linear", "dynamic", "longrope", "llama3", "proportional"}) {
    expect_refused(
        [&](auto& j) {
          j["rope_parameters"] = {{"rope_type", type}, {"factor", 2.0}};
        },
        {"'rope_parameters.rope_type'", fmt::format("\"{}\"", type),
         "supported: \"default\", \"yarn\""});
    expect_refused(
        [&](auto& j) {
          j["rope_scaling"] = {{"type", type}, {"factor", 2.0}};
        },
        {"'rope_scaling.type'", fmt::format("\"{}\"", type), "\"default\", \"yarn\""});
  }
  expect_refused(
      [](auto& j) {
        j["rope_parameters"] = {{"rope_type", nullptr}};
      },
      {"'rope_parameters.rope_type' must be a string"});
  expect_refused(
      [](auto& j) {
        j["rope_parameters"] = {{"rope_type", "yarn"}, {"type", "default"}};
      },
      {"'rope_parameters.rope_type' \"yarn\"", "'rope_parameters.type' \"default\""});
  expect_refused([](auto& j) { j["rope_parameters"] = "default"; },
                 {"'rope_parameters' must be an object"});
  expect_refused([](auto& j) { j["partial_rotary_factor"] = 0.5; },
                 {"'partial_rotary_factor' 0.5"});
  expect_refused(
      [](auto& j) {
        j["rope_parameters"] = {{"partial_rotary_factor", 0.25}};
      },
      {"'rope_parameters.partial_rotary_factor' 0.25"});
  expect_refused(
      [](auto& j) {
        j["rope_parameters"] = {{"full_attention", {{"rope_theta", 1e6}}}};
      },
      {"'rope_parameters.full_attention' is not a key of rope_type \"default\""});
  expect_refused(
      [](auto& j) {
        j["rope_parameters"] = {{"rope_type", "yarn"}, {"factr", 4.0}};
      },
      {"'rope_parameters.factr'", "\"yarn\""});
  expect_refused(
      [](auto& j) {
        j["rope_parameters"] = {{"rope_type", "yarn"}};
      },
      {"'rope_parameters.factor' is missing"});
  expect_refused(
      [](auto& j) {
        j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", -1}};
      },
      {"'rope_parameters.beta_fast' must be a positive number"});
  expect_refused(
      [](auto& j) {
        j["rope_parameters"] = {
            {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 16.5}};
      },
      {"'rope_parameters.original_max_position_embeddings' must be a positive integer"});
}

TEST_F(RopeConfig, RefusesLayoutsThatDisagreeNamingBothValues) {
  expect_refused(
      [](auto& j) {
        j["rope_theta"] = 1e4;
        j["rope_parameters"] = {{"rope_theta", 1e6}, {"rope_type", "default"}};
      },
      {"'rope_theta' 10000.0", "'rope_parameters.rope_theta' 1000000.0", "disagree"});
  expect_refused(
      [](auto& j) {
        j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
        j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 2.0}};
      },
      {"'rope_scaling' {\"factor\":4.0,\"type\":\"yarn\"}",
       "'rope_parameters' {\"factor\":2.0,\"rope_type\":\"yarn\"}", "disagree"});
  expect_refused(
      [](auto& j) {
        j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
        j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e4}};
      },
      {"'rope_scaling'", "'rope_parameters'", "disagree"});
}

// Load errors: a copy of a tiny model with one thing broken must fail with a message naming it.
class BrokenCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dspine_qwen3_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    core::remove_tree(dir_.string());
    fs::create_directories(dir_);
    for (const char* name : {"tied-single", "untied-sharded"}) {
      fs::copy(tiny_dir(name), dir_ / name, fs::copy_options::recursive);
    }
  }
  void TearDown() override { core::remove_tree(dir_.string()); }

  std::string path(const std::string& rel) const { return (dir_ / rel).string(); }

  void edit_config(const std::string& model, const std::function<void(nlohmann::json&)>& edit) {
    std::ifstream in(path(model + "/config.json"));
    nlohmann::json json = nlohmann::json::parse(in);
    edit(json);
    std::ofstream(path(model + "/config.json")) << json.dump(2);
  }

  void edit_weights(const std::string& file, const std::function<void(core::NamedTensors&)>& edit) {
    auto loaded = core::load_safetensors(path(file));
    edit(loaded.tensors);
    core::save_safetensors(path(file), loaded.tensors, loaded.metadata);
  }

  // load_hf(model) must throw an Error whose message contains every one of `parts`.
  void expect_error(const std::string& model, const std::vector<std::string>& parts) {
    try {
      Qwen3Model::load_hf(path(model), torch::kFloat, kCpu);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      for (const auto& part : parts) {
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
            << "'" << part << "' not in: " << e.what();
      }
    }
  }

  fs::path dir_;
};

TEST_F(BrokenCheckpoint, MissingTensorIsNamed) {
  edit_weights("tied-single/model.safetensors", [](core::NamedTensors& tensors) {
    tensors.erase(std::remove_if(
                      tensors.begin(), tensors.end(),
                      [](const auto& t) { return t.first == "model.layers.2.mlp.up_proj.weight"; }),
                  tensors.end());
  });
  expect_error("tied-single", {"missing tensor", "model.layers.2.mlp.up_proj.weight"});
}

TEST_F(BrokenCheckpoint, WrongShapeNamesTensorAndFile) {
  edit_weights("tied-single/model.safetensors", [](core::NamedTensors& tensors) {
    for (auto& [name, tensor] : tensors) {
      if (name == "model.layers.1.self_attn.k_proj.weight") tensor = torch::zeros({8, 32});
    }
  });
  expect_error("tied-single", {"model.layers.1.self_attn.k_proj.weight", "model.safetensors",
                               "[8, 32]", "expected [16, 32]"});
}

TEST_F(BrokenCheckpoint, ExtraTensorIsNamed) {
  edit_weights("tied-single/model.safetensors", [](core::NamedTensors& tensors) {
    tensors.emplace_back("lm_head.weight", torch::zeros({96, 32}));
  });
  expect_error("tied-single", {"unexpected tensor 'lm_head.weight'", "tie_word_embeddings"});
}

TEST_F(BrokenCheckpoint, UnsupportedOrBadConfigIsNamed) {
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](auto& j) { j["model_type"] = "llama"; }, "model_type"},
      {[](auto& j) { j["attention_bias"] = true; }, "attention_bias"},
      {[](auto& j) {
         j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
       },
       "rope_scaling.rope_type"},
      {[](auto& j) { j["use_sliding_window"] = true; }, "use_sliding_window"},
      {[](auto& j) { j.erase("hidden_size"); }, "missing key 'hidden_size'"},
      {[](auto& j) { j["num_key_value_heads"] = 3; }, "num_key_value_heads"},
      {[](auto& j) { j["vocab_size"] = "96"; }, "'vocab_size' must be a positive integer"},
  };
  const std::string original = path("tied-single/config.json") + ".orig";
  fs::copy_file(path("tied-single/config.json"), original);
  for (const auto& [edit, message] : cases) {
    fs::copy_file(original, path("tied-single/config.json"), fs::copy_options::overwrite_existing);
    edit_config("tied-single", edit);
    expect_error("tied-single", {"config.json", message});
  }
  std::ofstream(path("tied-single/config.json")) << "{ not json";
  expect_error("tied-single", {"config.json", "invalid JSON"});
  fs::remove(path("tied-single/config.json"));
  expect_error("tied-single", {"config.json", "cannot read"});
}

TEST_F(BrokenCheckpoint, ShardIndexMustMatchTheShards) {
  const std::string index_path = path("untied-sharded/model.safetensors.index.json");
  nlohmann::json index = nlohmann::json::parse(std::ifstream(index_path));
  const std::string moved = "model.norm.weight";
  const std::string holder = index["weight_map"][moved];
  index["weight_map"][moved] = holder == "model-00001-of-00008.safetensors"
                                   ? "model-00002-of-00008.safetensors"
                                   : "model-00001-of-00008.safetensors";
  std::ofstream(index_path) << index.dump();
  expect_error("untied-sharded", {"model.safetensors.index.json", moved});

  index["weight_map"][moved] = holder;
  std::ofstream(index_path) << index.dump();
  fs::remove(path("untied-sharded/" + holder));
  expect_error("untied-sharded", {holder, "not found"});
}

TEST_F(BrokenCheckpoint, DirectoryWithoutWeightsIsNamed) {
  fs::remove(path("tied-single/model.safetensors"));
  expect_error("tied-single", {"model.safetensors.index.json", "tied-single"});
}

}  // namespace
}  // namespace dspine::target
