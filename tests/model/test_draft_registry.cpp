// The draft registry (model/draft_registry.h): each architecture's map model.<name>, kept raw by
// core, parsed and checked by its entry with core's messages; the DSpine option checks of
// docs/model.md ("config.json"; the reference's test T10); the map to_yaml writes.
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/config.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "model/draft_registry.h"
#include "model/dspine_config.h"
#include "model/dspine_draft.h"
#include "model/module_state.h"
#include "model/simple_draft.h"
#include "common/fresh_dir.h"
#include "common/parity.h"
#include "common/tiny_dspine_yaml.h"

namespace dspine::model {
namespace {

const char* const kTinyDSpine = testing::kTinyDSpineYaml;

// A configuration with the architectures' maps (model/draft_registry.h: draft_sections).
core::Config parsed(const std::string& yaml, const std::string& source = "test.yaml",
                    const std::vector<std::string>& overrides = {}) {
  return core::parse_config(yaml, source, overrides, draft_sections());
}

core::Config resolved(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return parsed(yaml, "test.yaml", overrides);
}

const DSpineConfig& dspine_of(const core::Config& config) {
  return config.section<DSpineConfig>("model.dspine");
}

// The message parsing and resolving `yaml` throws; fails the test when it does not throw.
std::string resolve_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    resolved(yaml, overrides);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for:\n" << yaml;
  return "";
}

std::string tiny_dspine_with(const std::string& key, const std::string& value) {
  return resolve_error(kTinyDSpine, {"model.dspine." + key + "=" + value});
}

TEST(DraftRegistry, OneEntryPerArchitectureCoreAccepts) {
  EXPECT_EQ(draft_names(), core::architecture_names());
}

TEST(DraftRegistry, DefaultsAreTheReferencesAndToYamlWritesThemAll) {
  const core::Config c = resolved("");
  const DSpineConfig d = dspine_of(c);
  EXPECT_EQ(d.transfer_rank, 1024);
  EXPECT_EQ(d.message_size, 512);
  EXPECT_EQ(d.top_k, 16);
  EXPECT_EQ(d.replacement_layers, 3);
  const std::string yaml = core::to_yaml(c);
  EXPECT_NE(yaml.find("  fused_kernels: \"auto\"\n  dspine:\n    transfer_rank: 1024\n    "
                      "message_size: 512\n    top_k: 16\n    replacement_layers: 3\ndata:\n"),
            std::string::npos)
      << yaml;
  EXPECT_EQ(yaml.find("simple:"), std::string::npos) << yaml;  // no settings, no map
}

TEST(DraftRegistry, OverrideReplacesTheFileValue) {
  const core::Config c = resolved(kTinyDSpine, {"model.dspine.top_k=8"});
  EXPECT_EQ(dspine_of(c).top_k, 8);
  EXPECT_EQ(dspine_of(c).transfer_rank, 8);
}

TEST(DraftRegistry, UnknownKeySuggestsClosestKeyOfItsMap) {
  const std::string nested = resolve_error("model:\n  dspine:\n    topk: 4\n");
  EXPECT_NE(nested.find("did you mean model.dspine.top_k?"), std::string::npos) << nested;
  const std::string simple = resolve_error("model:\n  simple:\n    top_k: 4\n");
  EXPECT_NE(simple.find("model.simple.top_k: unknown key in model.simple"), std::string::npos)
      << simple;
}

TEST(DraftRegistry, RangeErrorsNameTheOverride) {
  const std::string message = tiny_dspine_with("top_k", "0");
  EXPECT_NE(message.find("config error in test.yaml: model.dspine.top_k = 0 is out of range: "
                         "DSpine requires"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("(from override 'model.dspine.top_k=0')"), std::string::npos) << message;
}

TEST(DraftRegistry, TinyDSpineConfigIsValid) {
  const core::Config config = parsed(kTinyDSpine, "tiny");
  const DSpineModelConfig c = dspine_model_config(config.model, *resolve_draft(config).settings);
  EXPECT_EQ(c.dspine.transfer_rank, 8);
  EXPECT_EQ(c.dspine.replacement_layers, 3);
}

// resolve_draft hands back model.architecture's draft as parse_config read it; dspine_model_config
// joins its settings to the model section, and refuses another architecture's.
TEST(DraftRegistry, ResolvedDraftIsTheArchitecturesOwn) {
  const core::Config config = parsed(kTinyDSpine, "tiny", {"model.dspine.top_k=5"});
  const ResolvedDraft draft = resolve_draft(config);
  ASSERT_NE(draft.entry, nullptr);
  EXPECT_EQ(draft.entry->name, "dspine");
  ASSERT_NE(draft.settings->dspine(), nullptr);
  EXPECT_EQ(draft.settings->dspine()->top_k, 5);
  EXPECT_EQ(dspine_model_config(config.model, *draft.settings).dspine.top_k, 5);

  const core::Config defaults;
  const ResolvedDraft simple = resolve_draft(defaults);
  EXPECT_EQ(simple.entry->name, "simple");
  EXPECT_EQ(simple.settings->dspine(), nullptr);
  EXPECT_THROW(dspine_model_config(defaults.model, *simple.settings), Error);
}

// The build and config.json take the settings handed to them, not the configuration's map: a
// configuration saying otherwise builds the parsed draft (one parse per run).
TEST(DraftRegistry, BuildAndConfigJsonTakeTheResolvedSettings) {
  const ResolvedDraft draft = resolve_draft(parsed(kTinyDSpine, "tiny", {"model.dspine.top_k=5"}));
  const core::Config other = parsed(kTinyDSpine, "tiny", {"model.dspine.top_k=7"});
  const auto module = draft.entry->build(other.model, *draft.settings, torch::kCPU, torch::kFloat);
  const auto* dspine = dynamic_cast<const DSpineDraftImpl*>(module.get());
  ASSERT_NE(dspine, nullptr);
  EXPECT_EQ(dspine->config().dspine.top_k, 5);
  const auto hf = draft.entry->hf_config(other.model, *draft.settings, HfConfigContext{});
  EXPECT_EQ(hf.at("dspine_config").at("top_k"), 5);

  const core::Config defaults;
  const ResolvedDraft simple = resolve_draft(defaults);
  const auto built =
      simple.entry->build(defaults.model, *simple.settings, torch::kCPU, torch::kBFloat16);
  ASSERT_NE(dynamic_cast<const SimpleDraftImpl*>(built.get()), nullptr);
  for (const auto& parameter : built->parameters()) {
    EXPECT_EQ(parameter.scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(
      simple.entry->hf_config(defaults.model, *simple.settings, HfConfigContext{}).at("model_type"),
      "dspine-simple");
}

// Each entry's load takes back, exactly, the weights of a draft its build made; the DSpine
// entry's also its transfer space.
TEST(DraftRegistry, LoadTakesBackASavedDraft) {
  const auto dir = testing::fresh_dir("draft_registry_load");
  for (const std::string& yaml : {std::string(kTinyDSpine), std::string("{}")}) {
    const core::Config config = parsed(yaml);
    const ResolvedDraft draft = resolve_draft(config);
    SCOPED_TRACE(draft.entry->name);
    torch::manual_seed(1);
    auto saved = draft.entry->build(config.model, *draft.settings, torch::kCPU, torch::kFloat);
    if (auto* dspine = dynamic_cast<DSpineDraftImpl*>(saved.get())) {
      dspine->initialize_transfer_space(
          torch::randn({config.model.vocab_size, config.model.hidden_size}));
    }
    const std::string path = (dir / (draft.entry->name + ".safetensors")).string();
    core::save_safetensors(path, module_state(*saved));
    torch::manual_seed(2);
    auto loaded = draft.entry->build(config.model, *draft.settings, torch::kCPU, torch::kFloat);
    draft.entry->load(*loaded, path);
    testing::expect_same_state(module_state(*loaded), module_state(*saved));
  }
}

// The reference's test T10: invalid options are rejected with messages containing "DSpine".
TEST(DraftRegistry, DSpineTransferRankAboveHiddenAndVocabBoundIsRejected) {
  const std::string message = tiny_dspine_with("transfer_rank", "17");
  EXPECT_NE(message.find("model.dspine.transfer_rank = 17"), std::string::npos) << message;
  EXPECT_NE(message.find("DSpine transfer_rank must be in [1, min(hidden_size, vocab_size - 1)]"),
            std::string::npos)
      << message;
  EXPECT_NO_THROW(resolved(kTinyDSpine, {"model.dspine.transfer_rank=16"}));
}

TEST(DraftRegistry, DSpineTopKZeroIsRejected) {
  const std::string message = tiny_dspine_with("top_k", "0");
  EXPECT_NE(message.find("model.dspine.top_k = 0"), std::string::npos) << message;
  EXPECT_NE(message.find("DSpine requires message_size > 0 and top_k in [1, vocab_size]"),
            std::string::npos)
      << message;
  EXPECT_NE(tiny_dspine_with("top_k", "33").find("DSpine requires"), std::string::npos);
}

TEST(DraftRegistry, DSpineMessageSizeZeroIsRejected) {
  const std::string message = tiny_dspine_with("message_size", "0");
  EXPECT_NE(message.find("model.dspine.message_size = 0"), std::string::npos) << message;
  EXPECT_NE(message.find("DSpine requires message_size > 0"), std::string::npos) << message;
}

TEST(DraftRegistry, DSpineNonIntegerTopKIsRejected) {
  const std::string message = tiny_dspine_with("top_k", "2.5");
  EXPECT_NE(message.find("model.dspine.top_k = 2.5: DSpine top_k must be an integer"),
            std::string::npos)
      << message;
  EXPECT_NE(
      tiny_dspine_with("transfer_rank", "1024.0").find("DSpine transfer_rank must be an integer"),
      std::string::npos);
  EXPECT_NE(tiny_dspine_with("top_k", "true").find("DSpine top_k must be an integer"),
            std::string::npos);
}

}  // namespace
}  // namespace dspine::model
