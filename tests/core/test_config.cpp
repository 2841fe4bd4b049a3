// Configuration parsing: defaults, every class of error message, overrides, to_yaml round trip.
// The DSpine option checks of docs/model.md ("config.json"; the reference's test T10) are the
// draft registry's (tests/model/test_draft_registry.cpp).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/config.h"
#include "core/config_errors.h"
#include "core/settings.h"
#include "core/error.h"
#include "common/tiny_dspine_yaml.h"

namespace dspine::core {
namespace {

// Maps beyond core's, declared as an architecture or an objective declares its own
// (core/settings.h): a made-up draft's model.dspine and a made-up objective's objective.gspo.
struct TestDraft {
  int64_t transfer_rank = 8;
  int64_t message_size = 4;
  int64_t top_k = 16;
  int64_t replacement_layers = 3;
};
Settings settings_of(TestDraft& d, const Config&) {
  return {{"transfer_rank", &d.transfer_rank, at_least(d.transfer_rank, 1), "rank"},
          {"message_size", &d.message_size, at_least(d.message_size, 1), "message width"},
          {"top_k", &d.top_k, at_least(d.top_k, 1), "candidates"},
          {"replacement_layers", &d.replacement_layers, {}, "layers"}};
}

struct GspoSettings {
  int64_t group_size = 4;
  double clip = 0.2;
  std::string mode = "seq";
  bool normalize = true;
  std::vector<int64_t> layers = {};
};
Settings settings_of(GspoSettings& s, const Config&) {
  return {{"group_size", &s.group_size, at_least(s.group_size, 1), "blocks per group"},
          {"clip", &s.clip, {}, "clip range"},
          {"mode", &s.mode, {}, "sequence or token ratios", {"seq", "token"}},
          {"normalize", &s.normalize, {}, "normalise advantages"},
          {"layers", &s.layers, {}, "layers"}};
}

// The keys of objective.dspine (those that moved there, and prepass), read as text.
const std::vector<std::string> kMovedLeaves = {"num_anchors",
                                               "loss_decay_gamma",
                                               "objective_chunk_blocks",
                                               "ce_weight",
                                               "alignment_weight",
                                               "alignment_warmup_steps",
                                               "replacement_probability",
                                               "replacement_hold_ratio",
                                               "replacement_end_ratio",
                                               "candidate_mass_threshold",
                                               "prepass"};
struct MovedKeys {
  std::vector<std::string> values = std::vector<std::string>(kMovedLeaves.size());
};
Settings settings_of(MovedKeys& m, const Config&) {
  Settings settings;
  for (size_t i = 0; i < kMovedLeaves.size(); ++i) {
    settings.push_back({kMovedLeaves[i], &m.values[i], {}, "moved"});
  }
  return settings;
}

const SectionCatalog& catalog() {
  static const SectionCatalog sections = {
      section_type<TestDraft>("model.dspine"), section_type<NoSettings>("objective.ce"),
      section_type<MovedKeys>("objective.dspine"), section_type<GspoSettings>("objective.gspo")};
  return sections;
}

Config parse(const std::string& yaml, const std::string& source,
             const std::vector<std::string>& overrides = {}) {
  return parse_config(yaml, source, overrides, catalog());
}

Config load(const std::string& path, const std::vector<std::string>& overrides = {}) {
  return load_config(path, overrides, catalog());
}

// The message parse_config throws for `yaml`; fails the test when it does not throw.
std::string parse_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse(yaml, "test.yaml", overrides);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for:\n" << yaml;
  return "";
}

std::string load_error(const std::string& path) {
  try {
    load(path);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error loading " << path;
  return "";
}

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "dspine_test_config_" + name;
  std::ofstream(path) << text;
  return path;
}

const char* const kTinyDSpine = testing::kTinyDSpineYaml;

TEST(Config, EmptyYamlGivesStructDefaults) {
  const Config parsed = parse_config("", "empty");
  EXPECT_EQ(to_yaml(parsed), to_yaml(Config{}));
  EXPECT_TRUE(parsed.sections.empty());
  // The catalog's maps are held with their defaults when absent.
  EXPECT_EQ(parse("", "empty").sections.size(), catalog().size());
  EXPECT_EQ(parse("", "empty").section<TestDraft>("model.dspine").top_k, 16);
  EXPECT_EQ(parsed.training.learning_rate, 1e-3);
  EXPECT_EQ(parse("# only a comment\n", "comment").training.batch_size, 2);
}

TEST(Config, SectionWithoutKeysKeepsDefaults) {
  const Config parsed = parse("model:\ntraining:\n  batch_size: 8\n", "t");
  EXPECT_EQ(parsed.model.hidden_size, 64);
  EXPECT_EQ(parsed.training.batch_size, 8);
}

TEST(Config, EmbeddedDefaultParses) {
  EXPECT_NO_THROW(load(""));
  EXPECT_NO_THROW(parse(kEmbeddedDefaultConfig, "<embedded default>"));
}

TEST(Config, ReadsNestedSectionsAndEveryKind) {
  const Config c = parse(R"(
model:
  target_layer_ids: [0, 3]
  dspine:
    top_k: 7
data:
  seq_len: 32
  synthetic:
    temperature: 0.5
distributed:
  sharding: zero3
  timeout_s: 30
logging:
  level: debug
)",
                         "t");
  EXPECT_EQ(c.model.target_layer_ids, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(c.section<TestDraft>("model.dspine").top_k, 7);
  EXPECT_EQ(c.data.seq_len, 32);
  EXPECT_EQ(c.data.synthetic.temperature, 0.5);
  EXPECT_EQ(c.distributed.sharding, Sharding::kZero3);
  EXPECT_EQ(c.distributed.timeout_s, 30.0);
  EXPECT_EQ(c.logging.level, LogLevel::kDebug);
}

TEST(Config, WrongTypeNamesKeyValueAndExpectedType) {
  const std::string message = parse_error("training:\n  batch_size: abc\n");
  EXPECT_NE(message.find("config error in test.yaml"), std::string::npos) << message;
  EXPECT_NE(message.find("training.batch_size = abc"), std::string::npos) << message;
  EXPECT_NE(message.find("expected an integer"), std::string::npos) << message;
}

TEST(Config, FloatForIntegerKeyIsRejected) {
  const std::string message = parse_error("training:\n  total_steps: 2.5\n");
  EXPECT_NE(message.find("training.total_steps = 2.5: expected an integer, got a float"),
            std::string::npos)
      << message;
}

TEST(Config, BoolForIntegerKeyIsRejected) {
  const std::string message = parse_error("training:\n  batch_size: true\n");
  EXPECT_NE(message.find("training.batch_size = true: expected an integer, got a boolean"),
            std::string::npos)
      << message;
}

TEST(Config, MapWhereScalarExpectedIsRejected) {
  const std::string message = parse_error("training:\n  learning_rate: {a: 1}\n");
  EXPECT_NE(message.find("training.learning_rate = {a: 1}: expected a number, got a map"),
            std::string::npos)
      << message;
  const std::string section = parse_error("training: 3\n");
  EXPECT_NE(section.find("training = 3: expected a map of keys"), std::string::npos) << section;
}

TEST(Config, QuotedNumberIsAStringNotAnInteger) {
  const std::string message = parse_error("training:\n  batch_size: \"3\"\n");
  EXPECT_NE(message.find("got a quoted string"), std::string::npos) << message;
}

TEST(Config, NonFiniteFloatIsRejected) {
  const std::string message = parse_error("training:\n  learning_rate: .inf\n");
  EXPECT_NE(message.find("training.learning_rate = .inf: must be a finite number"),
            std::string::npos)
      << message;
}

TEST(Config, OutOfRangeNamesAllowedRange) {
  const std::string message = parse_error("training:\n  accumulation_steps: 0\n");
  EXPECT_NE(message.find("training.accumulation_steps = 0 is out of range; allowed: integer >= 1"),
            std::string::npos)
      << message;
  const std::string ratio = parse_error("training:\n  warmup_ratio: 1.0\n");
  EXPECT_NE(ratio.find("training.warmup_ratio = 1 is out of range; allowed: number in [0, 1)"),
            std::string::npos)
      << ratio;
}

TEST(Config, UnknownKeySuggestsClosestKeyOfItsSection) {
  const std::string message = parse_error("training:\n  batch_sise: 4\n");
  EXPECT_NE(message.find("training.batch_sise: unknown key in training"), std::string::npos)
      << message;
  EXPECT_NE(message.find("did you mean training.batch_size?"), std::string::npos) << message;
}

TEST(Config, UnknownKeyOfAnotherSectionNamesThatSection) {
  const std::string message = parse_error("training:\n  seq_len: 32\n");
  EXPECT_NE(message.find("seq_len belongs to another section: data.seq_len"), std::string::npos)
      << message;
}

TEST(Config, UnknownSectionSuggestsClosestSection) {
  const std::string message = parse_error("modle:\n  hidden_size: 8\n");
  EXPECT_NE(message.find("modle: unknown section; did you mean model?"), std::string::npos)
      << message;
  const std::string far = parse_error("optimizer:\n  lr: 1\n");
  EXPECT_NE(far.find("allowed: model, data, training, objective, checkpoint, logging, distributed"),
            std::string::npos)
      << far;
}

// An override whose section does not exist is about that section, not an empty list of keys.
TEST(Config, OverrideOfAnUnknownSectionNamesTheSection) {
  const std::string message = parse_error("", {"trainng.lr=1"});
  EXPECT_NE(message.find("trainng: unknown section; did you mean training?"), std::string::npos)
      << message;
  EXPECT_NE(message.find("allowed: model, data, training, objective"), std::string::npos)
      << message;
  const std::string nested = parse_error("", {"model.dspinee.top_k=4"});
  EXPECT_NE(nested.find("model.dspinee: unknown key in model; did you mean model.dspine?"),
            std::string::npos)
      << nested;
}

TEST(Config, OnNonfiniteIsSkipOrStop) {
  EXPECT_EQ(dspine::core::parse("", "t").training.on_nonfinite, OnNonfinite::kSkip);
  EXPECT_EQ(dspine::core::parse("training:\n  on_nonfinite: stop\n", "t").training.on_nonfinite,
            OnNonfinite::kStop);
  const std::string message = parse_error("training:\n  on_nonfinite: ignore\n");
  EXPECT_NE(message.find("training.on_nonfinite = ignore: not an allowed value; allowed: "
                         "skip, stop"),
            std::string::npos)
      << message;
}

TEST(Config, KeyGivenTwiceIsRejected) {
  const std::string message = parse_error("training:\n  seed: 1\n  seed: 2\n");
  EXPECT_NE(message.find("training.seed is given twice"), std::string::npos) << message;
}

TEST(Config, TopLevelMustBeAMap) {
  const std::string message = parse_error("- model\n- data\n");
  EXPECT_NE(message.find("the top level must be a map of sections"), std::string::npos) << message;
}

TEST(Config, EnumValueListsAllowedValues) {
  const std::string message = parse_error("training:\n  dtype: fp16\n");
  EXPECT_NE(message.find("training.dtype = fp16: not an allowed value; allowed: fp32, bf16"),
            std::string::npos)
      << message;
  const std::string level = parse_error("logging:\n  level: verbose\n");
  EXPECT_NE(level.find("allowed: trace, debug, info, warn, error"), std::string::npos) << level;
}

TEST(Config, TriStateKeysAcceptYamlBooleans) {
  EXPECT_EQ(parse("model:\n  fused_kernels: true\n", "t").model.fused_kernels, FusedKernels::kOn);
  EXPECT_EQ(parse("model:\n  fused_kernels: False\n", "t").model.fused_kernels, FusedKernels::kOff);
  EXPECT_EQ(parse("logging:\n  progress: false\n", "t").logging.progress, ProgressMode::kOff);
  const std::string message = parse_error("model:\n  fused_kernels: maybe\n");
  EXPECT_NE(message.find("allowed: auto, true, false"), std::string::npos) << message;
}

TEST(Config, BoolKeyRejectsNonBoolean) {
  const std::string message = parse_error("distributed:\n  prefetch: 1\n");
  EXPECT_NE(message.find("distributed.prefetch = 1: expected a boolean"),
            std::string::npos)
      << message;
}

TEST(Config, CrossKeyChecks) {
  EXPECT_NE(parse_error("model:\n  num_key_value_heads: 3\n")
                .find("model.num_attention_heads = 4 is out of range; allowed: a multiple of "
                      "model.num_key_value_heads = 3"),
            std::string::npos);
  EXPECT_NE(parse_error("model:\n  target_layer_ids: [0, 4]\n")
                .find("model.target_layer_ids[1] = 4 is out of range"),
            std::string::npos);
  EXPECT_NE(parse_error("model:\n  target_layer_ids: []\n").find("at least one target layer"),
            std::string::npos);
  EXPECT_NE(parse_error("model:\n  num_target_layers: 2\n")
                .find("model.target_layer_ids[2] = 2 is out of range; allowed: a layer of the "
                      "target, in [0, model.num_target_layers = 2)"),
            std::string::npos);
  EXPECT_NE(parse_error("model:\n  num_target_layers: -1\n")
                .find("model.num_target_layers = -1 is out of range"),
            std::string::npos);
  EXPECT_NE(parse_error("model:\n  mask_token_id: 256\n").find("model.mask_token_id = 256"),
            std::string::npos);
  EXPECT_NE(parse_error("data:\n  source: shards\n").find("data.shards_dir"), std::string::npos);
  EXPECT_NE(parse_error("data:\n  seq_len: 8\n").find("data.synthetic.prompt_length = 8"),
            std::string::npos);
  // Target layers are bounded by the synthetic target only when it is the data source.
  EXPECT_NO_THROW(
      parse("model:\n  target_layer_ids: [9]\ndata:\n  source: shards\n"
            "  shards_dir: /tmp/shards\n",
            "t"));
}

// The recipe runs on random inputs for benchmarks: its target layers exceed the synthetic
// target's, which the random source does not use; its prompt length is still checked.
TEST(Config, RandomSourceTakesTheRecipeAndChecksPromptLength) {
  const Config c = load(std::string(DSPINE_SOURCE_DIR) + "/configs/qwen3-8b-dspine.yaml",
                        {"data.source=random"});
  EXPECT_EQ(c.data.source, DataSource::kRandom);
  EXPECT_EQ(c.model.target_layer_ids.size(), 5u);
  EXPECT_NE(parse_error("data:\n  source: random\n  seq_len: 8\n")
                .find("data.synthetic.prompt_length = 8"),
            std::string::npos);
  EXPECT_NE(parse_error("data:\n  source: files\n").find("allowed: synthetic, shards, random"),
            std::string::npos);
}

TEST(Config, TargetAndSpecforgeSourcesNeedTheirPaths) {
  EXPECT_NE(parse_error("data:\n  source: target\n  samples: s\n").find("data.target.path"),
            std::string::npos);
  EXPECT_NE(parse_error("data:\n  source: target\n  target: {path: /m}\n").find("data.samples"),
            std::string::npos);
  EXPECT_NE(parse_error("data:\n  source: specforge\n  target: {path: /m}\n")
                .find("data.specforge_dir"),
            std::string::npos);
  EXPECT_NE(parse_error("data:\n  source: specforge\n  specforge_dir: /d\n")
                .find("data.target.path"),
            std::string::npos);
  EXPECT_NE(parse_error("data:\n  target: {seed: -1}\n").find("data.target.seed = -1"),
            std::string::npos);
  EXPECT_NE(parse_error("data:\n  target: {pth: /m}\n").find("data.target.path"),
            std::string::npos);  // did you mean
  EXPECT_NE(parse_error("data:\n  target: {random: maybe}\n").find("data.target.random"),
            std::string::npos);
  // A random target needs no samples: it reads random token ids.
  const Config c = parse(
      "model:\n  target_layer_ids: [9]\ndata:\n  source: target\n"
      "  target: {path: /m, random: true, seed: 3}\n",
      "t");
  EXPECT_TRUE(c.data.target.random);
  EXPECT_EQ(c.data.target.seed, 3);
  EXPECT_NE(to_yaml(c).find("random: true"), std::string::npos);
  EXPECT_NO_THROW(
      parse("data:\n  source: specforge\n  specforge_dir: /d\n  target: "
            "{path: /m}\n",
            "t"));
}

TEST(Config, MissingFileErrorNamesThePath) {
  const std::string path = ::testing::TempDir() + "no_such_dir/missing.yaml";
  const std::string message = load_error(path);
  EXPECT_NE(message.find(path), std::string::npos) << message;
}

TEST(Config, YamlSyntaxErrorNamesFileAndLine) {
  const std::string path = write_temp("syntax.yaml", "training:\n  batch_size: 2\n  lr: [1, 2\n");
  const std::string message = load_error(path);
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("YAML syntax error at line"), std::string::npos) << message;
}

TEST(Config, OverrideReplacesFileValueAndCreatesSections) {
  const std::string path = write_temp("override.yaml", "training:\n  learning_rate: 0.001\n");
  const Config c = load(path, {"training.learning_rate=3e-4", "model.dspine.top_k=8",
                               "model.target_layer_ids=[1,2]", "logging.metrics_file="});
  EXPECT_EQ(c.training.learning_rate, 3e-4);
  EXPECT_EQ(c.section<TestDraft>("model.dspine").top_k, 8);
  EXPECT_EQ(c.model.target_layer_ids, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(c.logging.metrics_file, "");
  EXPECT_EQ(parse("", "t", {"training.batch_size = 5"}).training.batch_size, 5);
}

TEST(Config, OverrideWithBadValueNamesKeyAndOverride) {
  const std::string message = parse_error("", {"training.batch_size=abc"});
  EXPECT_NE(message.find("training.batch_size = abc: expected an integer"), std::string::npos)
      << message;
  EXPECT_NE(message.find("from override 'training.batch_size=abc'"), std::string::npos) << message;
  const std::string range = parse_error("", {"training.total_steps=0"});
  EXPECT_NE(range.find("training.total_steps = 0 is out of range"), std::string::npos) << range;
}

TEST(Config, MalformedOrUnknownOverrideNamesTheOverride) {
  const std::string no_equals = parse_error("", {"training.batch_size"});
  EXPECT_NE(no_equals.find("override 'training.batch_size' is malformed"), std::string::npos)
      << no_equals;
  EXPECT_NE(parse_error("", {"=3"}).find("override '=3' is malformed"), std::string::npos);
  EXPECT_NE(parse_error("", {"training..seed=3"}).find("malformed"), std::string::npos);
  const std::string unknown = parse_error("", {"training.batch_sise=3"});
  EXPECT_NE(unknown.find("override 'training.batch_sise=3'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("did you mean training.batch_size?"), std::string::npos) << unknown;
  EXPECT_NE(parse_error("", {"model.dspine=3"}).find("names the map model.dspine"),
            std::string::npos);
}

TEST(Config, LrIsAnAliasOfLearningRate) {
  EXPECT_EQ(parse("training:\n  lr: 0.01\n", "t").training.learning_rate, 0.01);
  const std::string both = parse_error("training:\n  lr: 0.01\n  learning_rate: 0.02\n");
  EXPECT_NE(both.find("training.lr and training.learning_rate are both given"), std::string::npos)
      << both;
  EXPECT_EQ(
      parse("training:\n  learning_rate: 0.02\n", "t", {"training.lr=0.5"}).training.learning_rate,
      0.5);
}

TEST(Config, ToYamlRoundTripsEveryKeyExactly) {
  Config c = parse(kTinyDSpine, "tiny");
  c.training.learning_rate = 0.1 + 0.2;  // needs 17 significant digits
  c.model.rope_theta = 1e6;
  c.model.fused_kernels = FusedKernels::kOff;
  c.model.mask_token_id = 5;
  c.checkpoint.dir = "runs/a: b #c \"quoted\"";
  c.checkpoint.resume = "auto";
  c.logging.metrics_file = "";
  c.distributed.prefetch = false;
  c.distributed.sharding = Sharding::kZero2;
  c.distributed.timeout_s = 0.25;
  c.data.synthetic.seed = -0 + 987654321012345;
  GspoSettings gspo;
  gspo.clip = -1.0 / 3.0;
  gspo.layers = {4, 5};
  c.set_section("objective.gspo", gspo);
  const std::string yaml = to_yaml(c);
  const Config back = parse(yaml, "to_yaml");
  EXPECT_EQ(to_yaml(back), yaml);
  EXPECT_EQ(back.training.learning_rate, 0.1 + 0.2);
  EXPECT_EQ(back.section<GspoSettings>("objective.gspo").clip, -1.0 / 3.0);
  EXPECT_EQ(back.section<GspoSettings>("objective.gspo").layers, gspo.layers);
  EXPECT_EQ(back.model.fused_kernels, FusedKernels::kOff);
  EXPECT_EQ(back.checkpoint.dir, c.checkpoint.dir);
  EXPECT_EQ(back.logging.metrics_file, "");
  EXPECT_FALSE(back.distributed.prefetch);
  EXPECT_EQ(back.distributed.sharding, Sharding::kZero2);
  EXPECT_EQ(back.distributed.timeout_s, 0.25);
  EXPECT_EQ(back.data.synthetic.seed, 987654321012345);
  EXPECT_EQ(back.model.target_layer_ids, c.model.target_layer_ids);
  EXPECT_NE(yaml.find("rms_norm_eps: 1.0e-06"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("adam_eps: 1.0e-08"), std::string::npos) << yaml;  // a float for YAML 1.1
}

TEST(Config, DistributedKeysAreChecked) {
  std::string message = parse_error("distributed:\n  sharding: zero4\n");
  EXPECT_NE(message.find("allowed: none, zero2, zero3"), std::string::npos) << message;
  message = parse_error("distributed:\n  timeout_s: 0\n");
  EXPECT_NE(message.find("distributed.timeout_s = 0"), std::string::npos) << message;
}

// Maps beyond core's (core/settings.h): read, checked and written as core's own.

GspoSettings read_gspo(const Config& config) {
  return config.section<GspoSettings>("objective.gspo");
}

std::string section_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    read_gspo(parse(yaml, "test.yaml", overrides));
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for:\n" << yaml;
  return "";
}

const char* const kGspoSection = R"(
objective:
  name: gspo
  gspo:
    group_size: 8
    mode: "token"
    layers: [1, 2]
)";

TEST(ConfigSection, SectionsAreTypedAndRoundTripThroughToYaml) {
  const Config c = parse(kGspoSection, "gspo.yaml");
  EXPECT_EQ(c.objective.name, "gspo");  // which names exist is the registry's check
  EXPECT_EQ(c.source, "gspo.yaml");
  ASSERT_EQ(c.sections.count("objective.gspo"), 1u);
  const std::string yaml = to_yaml(c);
  // Written whole: every key of the map with its value, in declaration order.
  EXPECT_NE(yaml.find("  gspo:\n    group_size: 8\n    clip: 0.2\n    mode: \"token\"\n"),
            std::string::npos)
      << yaml;
  const Config back = parse(yaml, "to_yaml");
  EXPECT_EQ(setting_values(back), setting_values(c));
  EXPECT_EQ(to_yaml(back), yaml);
  const GspoSettings s = read_gspo(back);
  EXPECT_EQ(s.group_size, 8);
  EXPECT_EQ(s.mode, "token");
  EXPECT_EQ(s.layers, (std::vector<int64_t>{1, 2}));
  // "gspo:" with nothing under it keeps the defaults.
  EXPECT_EQ(read_gspo(parse("objective:\n  gspo:\n", "t")).group_size, 4);
}

TEST(ConfigSection, AbsentSectionKeepsTheDefaults) {
  const GspoSettings s = read_gspo(parse("", "t"));
  EXPECT_EQ(s.group_size, 4);
  EXPECT_EQ(s.clip, 0.2);
  EXPECT_EQ(s.mode, "seq");
  EXPECT_TRUE(s.normalize);
  EXPECT_EQ(read_gspo(Config{}).group_size, 4);
}

TEST(ConfigSection, OverridesReachObjectiveSettings) {
  const Config c =
      parse(kGspoSection, "t", {"objective.gspo.group_size=16", "objective.gspo.clip=0.5"});
  EXPECT_EQ(read_gspo(c).group_size, 16);
  EXPECT_EQ(read_gspo(c).clip, 0.5);
  EXPECT_EQ(read_gspo(parse("", "t", {"objective.gspo.normalize=false"})).normalize, false);
  EXPECT_NE(parse_error("", {"objective.gspo=3"}).find("names the map objective.gspo"),
            std::string::npos);
  EXPECT_NE(parse_error("", {"objective.name.x=3"}).find("unknown key in objective.name"),
            std::string::npos);
}

TEST(ConfigSection, NonMapSectionIsAnErrorNamingTheKey) {
  std::string message = parse_error("objective:\n  gspo: 3\n");
  EXPECT_NE(message.find("config error in test.yaml: objective.gspo = 3: an objective's settings "
                         "must be a map, got an integer"),
            std::string::npos)
      << message;
  message = parse_error("objective:\n  nmae: dspine\n");
  EXPECT_NE(message.find("did you mean objective.name?"), std::string::npos) << message;
}

TEST(ConfigSection, TypeErrorsNameTheFullKey) {
  std::string message = section_error(kGspoSection, {"objective.gspo.group_size=abc"});
  EXPECT_NE(message.find("config error in test.yaml: objective.gspo.group_size = abc: expected an "
                         "integer, got a string"),
            std::string::npos)
      << message;
  message = section_error(kGspoSection, {"objective.gspo.mode=both"});
  EXPECT_NE(message.find("objective.gspo.mode = both: not an allowed value; allowed: seq, token"),
            std::string::npos)
      << message;
  message = section_error("objective:\n  gspo:\n    clip: .inf\n");
  EXPECT_NE(message.find("objective.gspo.clip = .inf: must be a finite number"), std::string::npos)
      << message;
}

TEST(ConfigSection, UnknownKeyGetsDidYouMean) {
  const std::string message = section_error("objective:\n  gspo:\n    grup_size: 8\n");
  EXPECT_NE(message.find("config error in test.yaml: objective.gspo.grup_size: unknown key in "
                         "objective.gspo; did you mean objective.gspo.group_size?"),
            std::string::npos)
      << message;
  const std::string far = section_error("objective:\n  gspo:\n    window: 1\n");
  EXPECT_NE(far.find("allowed: group_size, clip, mode, normalize, layers"), std::string::npos)
      << far;
}

TEST(ConfigSection, RangeErrorsHaveCoresFormat) {
  Config c;
  c.source = "run.yaml";
  try {
    range_error(c, "objective.gspo.group_size", "0", "integer >= 1");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "config error in run.yaml: objective.gspo.group_size = 0 is out of range; allowed: "
              "integer >= 1");
  }
}

// What a new key costs (docs/ARCHITECTURE.md): the member with its default, and one line in its
// map's declaration. Reading, the rule, to_yaml, the reference's facts, the resume comparison and
// the unknown-key suggestions all follow from that line.
struct WithNewKey {
  int64_t group_size = 4;
  int64_t new_key = 7;  // the member
};
Settings settings_of(WithNewKey& s, const Config&) {
  return {{"group_size", &s.group_size, at_least(s.group_size, 1), "blocks per group"},
          {"new_key", &s.new_key, at_least(s.new_key, 1), "a key added in one line"}};
}

TEST(ConfigSection, ANewKeyIsOneLine) {
  const SectionCatalog with_new = {section_type<WithNewKey>("objective.new")};
  const Config c = parse_config("objective:\n  new:\n    new_key: 9\n", "t", {}, with_new);
  EXPECT_EQ(c.section<WithNewKey>("objective.new").new_key, 9);
  EXPECT_NE(to_yaml(c).find("  new:\n    group_size: 4\n    new_key: 9\n"), std::string::npos)
      << to_yaml(c);
  EXPECT_EQ(setting_values(c).at("objective.new.new_key"), "9");
  const std::vector<KeyFacts> facts = section_key_facts(with_new);
  ASSERT_EQ(facts.size(), 2u);
  EXPECT_EQ(facts[1].key, "objective.new.new_key");
  EXPECT_EQ(facts[1].type, "integer");
  EXPECT_EQ(facts[1].default_value, "7");
  EXPECT_EQ(facts[1].allowed, "integer >= 1");
  EXPECT_EQ(facts[1].description, "a key added in one line");
  auto error = [&](const std::string& yaml) {
    try {
      parse_config(yaml, "t", {}, with_new);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error("objective:\n  new:\n    new_key: 0\n"),
            "config error in t: objective.new.new_key = 0 is out of range; allowed: integer >= 1");
  EXPECT_NE(
      error("objective:\n  new:\n    new_kee: 3\n").find("did you mean objective.new.new_key?"),
      std::string::npos);
}

// Every rule runs once per parse, after every key is read, and nowhere else: writing,
// comparing and documenting a configuration run none.
int rule_runs = 0;
struct CountedRule {
  int64_t value = 1;
};
Settings settings_of(CountedRule& s, const Config&) {
  return {{"value", &s.value,
           rule("counted",
                [](const std::string&) {
                  ++rule_runs;
                  return std::optional<RuleFailure>();
                }),
           "a rule that counts its runs"}};
}

TEST(ConfigSection, EveryRuleRunsOncePerParse) {
  const SectionCatalog counted = {section_type<CountedRule>("objective.counted")};
  rule_runs = 0;
  const Config c = parse_config("objective:\n  counted:\n    value: 3\n", "t", {}, counted);
  EXPECT_EQ(rule_runs, 1);
  to_yaml(c);
  setting_values(c);
  section_key_facts(counted);
  const Config copy = c;
  EXPECT_EQ(copy.section<CountedRule>("objective.counted").value, 3);
  EXPECT_EQ(rule_runs, 1);
}

// Keys moved to objective.dspine: the old name still works for one release, with a warning.
const std::vector<std::pair<std::string, std::string>> kMoved = {
    {"training.num_anchors", "4"},
    {"training.loss_decay_gamma", "3.5"},
    {"training.objective_chunk_blocks", "8"},
    {"model.dspine.ce_weight", "0.25"},
    {"model.dspine.alignment_weight", "0.75"},
    {"model.dspine.alignment_warmup_steps", "10"},
    {"model.dspine.replacement_probability", "0.125"},
    {"model.dspine.replacement_hold_ratio", "0.0625"},
    {"model.dspine.replacement_end_ratio", "0.5"},
    {"model.dspine.candidate_mass_threshold", "0.001"},
};

// "a.b.c" = v as nested YAML maps.
std::string yaml_of(const std::string& key, const std::string& value) {
  std::string yaml, indent;
  size_t begin = 0;
  for (size_t dot; (dot = key.find('.', begin)) != std::string::npos; begin = dot + 1) {
    yaml += indent + key.substr(begin, dot - begin) + ":\n";
    indent += "  ";
  }
  return yaml + indent + key.substr(begin) + ": " + value + "\n";
}

std::string new_key_of(const std::string& old_key) {
  return "objective.dspine." + old_key.substr(old_key.rfind('.') + 1);
}

std::string dspine_section_value(const Config& c, const std::string& leaf) {
  const auto index = std::find(kMovedLeaves.begin(), kMovedLeaves.end(), leaf);
  return c.section<MovedKeys>("objective.dspine").values.at(index - kMovedLeaves.begin());
}

TEST(ConfigLegacyKeys, EachMovesToObjectiveDSpineWithAWarning) {
  for (const auto& [old_key, value] : kMoved) {
    SCOPED_TRACE(old_key);
    const std::string leaf = old_key.substr(old_key.rfind('.') + 1);
    ::testing::internal::CaptureStdout();
    ::testing::internal::CaptureStderr();
    const Config c = parse(yaml_of(old_key, value), "old.yaml");
    const std::string logged =
        ::testing::internal::GetCapturedStdout() + ::testing::internal::GetCapturedStderr();
    EXPECT_NE(logged.find(old_key + " is deprecated; use " + new_key_of(old_key)),
              std::string::npos)
        << logged;
    EXPECT_EQ(dspine_section_value(c, leaf), value);
    // The moved value is written under its new name only.
    const std::string yaml = to_yaml(c);
    EXPECT_EQ(yaml.find(leaf), yaml.rfind(leaf)) << yaml;
    // An override under the old name lands there too and replaces the file's value.
    const Config overridden =
        parse(yaml_of(new_key_of(old_key), "1"), "t", {old_key + "=" + value});
    EXPECT_EQ(dspine_section_value(overridden, leaf), value);
  }
}

TEST(ConfigLegacyKeys, OldAndNewNameTogetherAreAnError) {
  for (const auto& [old_key, value] : kMoved) {
    SCOPED_TRACE(old_key);
    const std::string message =
        parse_error(yaml_of(old_key, value) + yaml_of(new_key_of(old_key), value));
    EXPECT_NE(message.find(old_key + " and " + new_key_of(old_key) + " are both given"),
              std::string::npos)
        << message;
  }
}

}  // namespace
}  // namespace dspine::core
