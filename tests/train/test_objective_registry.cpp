// The objective registry: objective.name and model.architecture are checked against it; the
// objective.<x> maps are its objectives' declarations, read and checked by parse_config with the
// run catalog (train/run_config.h).
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/dspine_tiny.h"
#include "common/expect_error.h"
#include "core/config.h"
#include "data/batch_source.h"
#include "objectives/dspine_objective.h"
#include "objectives/dspine_settings.h"
#include "objectives/gspo_objective.h"
#include "train/objective_registry.h"
#include "train/run_config.h"

namespace dspine::train {
namespace {

using testing::expect_error_mentioning;

// The tiny DSpine configuration as a YAML text, so that overrides go through parse_config.
core::Config tiny(const std::vector<std::string>& overrides = {}) {
  core::Config config = testing::tiny_config();
  config.data.synthetic.num_layers = 7;  // the synthetic target must have tiny's layers 1, 4, 6
  return parse_run_config(core::to_yaml(config), "tiny.yaml", overrides);
}

// Parsing the tiny configuration with `overrides` and resolving its objective fails naming
// `parts`.
void expect_objective_error(const std::vector<std::string>& overrides,
                            const std::vector<std::string>& parts) {
  expect_error_mentioning([&] { resolve_run(tiny(overrides)); }, parts);
}

const objectives::DSpineSettings& dspine_settings(const core::Config& config) {
  return config.section<objectives::DSpineSettings>("objective.dspine");
}

const objectives::GspoSettings& gspo_settings(const core::Config& config) {
  return config.section<objectives::GspoSettings>("objective.gspo");
}

TEST(ObjectiveRegistry, ListsEveryObjective) {
  EXPECT_EQ(objective_names(), (std::vector<std::string>{"ce", "dspine", "gspo"}));
  EXPECT_EQ(resolve_run(tiny()).entry->name, "dspine");
  EXPECT_EQ(resolve_run(tiny()).entry->architecture, "dspine");
  // The embedded default.
  EXPECT_EQ(resolve_run(load_run_config("")).entry->name, "dspine");
  EXPECT_EQ(load_run_config("").training.eval_every, 50);  // configs/tiny.yaml measures its run
  EXPECT_EQ(resolve_run(core::Config{}).entry->name, "ce");
}

// resolve_run hands out the parsed settings; the DSpine-draft objectives hand out
// objective.dspine from them.
TEST(ObjectiveRegistry, ResolvesTheParsedSettings) {
  EXPECT_EQ(resolve_run(tiny({"objective.dspine.num_anchors=5"})).settings->dspine()->num_anchors,
            5);
  const auto gspo = resolve_run(tiny({"objective.name=gspo", "objective.dspine.num_anchors=6"}));
  EXPECT_EQ(gspo.settings->dspine()->num_anchors, 6);
  EXPECT_EQ(resolve_run(core::Config{}).settings->dspine(), nullptr);  // ce
}

// The build takes the settings resolve_run handed out: it does not read objective.dspine again
// (here a configuration saying otherwise is built with them), and the built objective, its
// acceptance evaluator and BuiltModel::settings all hold the parsed ones.
TEST(ObjectiveRegistry, BuildTakesTheResolvedSettings) {
  const auto resolved = resolve_run(tiny({"objective.dspine.num_anchors=5"}));
  const auto other = tiny({"objective.dspine.num_anchors=7"});
  auto source = data::make_batch_source(other, torch::kCPU);
  const BuiltModel built = build_model(other, resolved, *source, torch::kCPU, torch::kFloat32);
  EXPECT_EQ(built.settings, resolved.settings);
  const auto& objective = dynamic_cast<const objectives::DSpineObjective&>(*built.objective);
  EXPECT_EQ(objective.dspine_settings().num_anchors, 5);
  EXPECT_NE(built.acceptance, nullptr);
}

TEST(ObjectiveRegistry, UnknownNameSuggestsTheClosest) {
  expect_objective_error({"objective.name=dspien"},
                         {"config error in tiny.yaml: objective.name = dspien is out of range; "
                          "allowed: ce, dspine, gspo (did you mean dspine?)"});
  expect_objective_error({"objective.name=reinforce"},
                         {"objective.name = reinforce is out of range; allowed: ce, dspine, gspo"});
}

TEST(ObjectiveRegistry, ArchitectureMustBeTheObjectives) {
  expect_objective_error(
      {"objective.name=ce"},
      {"model.architecture = dspine is out of range; allowed: simple", "objective.name = ce"});
  expect_objective_error(
      {"model.architecture=simple"},
      {"model.architecture = simple", "allowed: dspine", "objective.name = dspine"});
}

TEST(ObjectiveRegistry, UnknownSectionGetsDidYouMean) {
  expect_objective_error({"objective.dspin.num_anchors=3"},
                         {"config error in tiny.yaml: override 'objective.dspin.num_anchors=3': "
                          "objective.dspin: unknown key in objective; did you mean "
                          "objective.dspine?"});
  expect_objective_error(
      {"objective.grpo.group_size=4"},
      {"objective.grpo: unknown key in objective; did you mean objective.gspo?"});
  // Another registered objective's section may stay in the file (the embedded default's
  // objective.dspine in a ce run).
  const auto ce =
      tiny({"objective.name=ce", "model.architecture=simple", "objective.dspine.num_anchors=3"});
  EXPECT_EQ(resolve_run(ce).entry->name, "ce");
}

TEST(ObjectiveRegistry, CeHasNoSettings) {
  expect_objective_error(
      {"objective.name=ce", "model.architecture=simple", "objective.ce.weight=1"},
      {"objective.ce.weight: unknown key in objective.ce; objective.ce takes "
       "no keys"});
}

TEST(DSpineSettings, DefaultsAndOverrides) {
  const auto defaults = dspine_settings(tiny());
  EXPECT_EQ(defaults.num_anchors, 512);
  EXPECT_EQ(defaults.replacement_hold_ratio, 1.0 / 6.0);
  const auto s =
      dspine_settings(tiny({"objective.dspine.num_anchors=4", "objective.dspine.ce_weight=1"}));
  EXPECT_EQ(s.num_anchors, 4);
  EXPECT_EQ(s.ce_weight, 1.0);  // float settings accept integers
}

TEST(DSpineSettings, RangeErrorsNameTheObjectiveKey) {
  expect_objective_error({"objective.dspine.num_anchors=0"},
                         {"config error in tiny.yaml: objective.dspine.num_anchors = 0 is out of "
                          "range; allowed: integer >= 1"});
  // Under its deprecated name too: the value now lives in objective.dspine.
  expect_objective_error({"training.num_anchors=0"},
                         {"objective.dspine.num_anchors = 0 is out of range"});
  expect_objective_error({"objective.dspine.objective_chunk_blocks=-1"},
                         {"objective.dspine.objective_chunk_blocks = -1 is out of range"});
  expect_objective_error(
      {"objective.dspine.replacement_hold_ratio=0.5"},
      {"objective.dspine.replacement_hold_ratio = 0.5 is out of range",
       "DSpine requires 0 <= replacement_hold_ratio < replacement_end_ratio <= 1"});
  expect_objective_error(
      {"objective.dspine.ce_weight=1.5"},
      {"objective.dspine.ce_weight = 1.5", "DSpine requires ce_weight in [0, 1]"});
}

TEST(DSpineSettings, TypeAndUnknownKeyErrorsNameTheObjectiveKey) {
  expect_objective_error({"objective.dspine.alignment_weight=.nan"},
                         {"objective.dspine.alignment_weight = .nan: DSpine alignment_weight must "
                          "be finite"});
  expect_objective_error({"objective.dspine.num_anchors=2.5"},
                         {"objective.dspine.num_anchors = 2.5: DSpine num_anchors must be an "
                          "integer"});
  expect_objective_error({"objective.dspine.num_anchor=3"},
                         {"objective.dspine.num_anchor: unknown key in objective.dspine; did you "
                          "mean objective.dspine.num_anchors?"});
}

// The rollout's refinement candidates are the built draft's model.dspine.top_k (parsed once, by
// the draft registry), not a setting of objective.gspo.
TEST(GspoSettings, RolloutTopKIsTheDraftsOwn) {
  const auto config = tiny({"objective.name=gspo"});
  auto source = data::make_batch_source(config, torch::kCPU);
  const BuiltModel built =
      build_model(config, resolve_run(config), *source, torch::kCPU, torch::kFloat32);
  const auto& objective = dynamic_cast<const objectives::GspoObjective&>(*built.objective);
  EXPECT_EQ(objective.gspo_settings().rollout.top_k, 3);  // model.dspine.top_k of the tiny draft
}

TEST(GspoSettings, DefaultsAndEveryKey) {
  const auto defaults = gspo_settings(tiny({"objective.name=gspo"}));
  EXPECT_EQ(defaults.rollout.group_size, 4);
  EXPECT_EQ(defaults.updates_per_rollout, 1);
  const auto s = gspo_settings(
      tiny({"objective.name=gspo", "objective.gspo.group_size=8", "objective.gspo.temperature=0.7",
            "objective.gspo.sampling=refinement", "objective.gspo.reward=expected_acceptance",
            "objective.gspo.advantage_norm=group_mean", "objective.gspo.eps_low=0.2",
            "objective.gspo.eps_high=0.28", "objective.gspo.logits_scale=2",
            "objective.gspo.updates_per_rollout=3", "objective.gspo.ce_weight=0.1",
            "objective.gspo.init_from=runs/x/step-000010"}));
  EXPECT_EQ(s.rollout.group_size, 8);
  EXPECT_EQ(s.rollout.temperature, 0.7);
  EXPECT_EQ(s.rollout.sampling, objectives::GspoSampling::kRefinement);
  EXPECT_EQ(s.rollout.reward, objectives::GspoReward::kExpectedAcceptance);
  EXPECT_EQ(s.rollout.advantage_norm, objectives::GspoAdvantageNorm::kGroupMean);
  EXPECT_EQ(s.eps_low, 0.2);
  EXPECT_EQ(s.eps_high, 0.28);
  EXPECT_EQ(s.rollout.logits_scale, 2.0);
  EXPECT_EQ(s.updates_per_rollout, 3);
  EXPECT_EQ(s.ce_weight, 0.1);
  EXPECT_EQ(s.init_from, "runs/x/step-000010");
  EXPECT_EQ(resolve_run(tiny({"objective.name=gspo", "objective.gspo.group_size=2"})).entry->name,
            "gspo");
}

TEST(GspoSettings, ErrorsNameTheKeyAndValue) {
  auto gspo = [](const std::string& setting) {
    return std::vector<std::string>{"objective.name=gspo", "objective.gspo." + setting};
  };
  expect_objective_error(gspo("group_size=1"),
                         {"objective.gspo.group_size = 1 is out of range; allowed: integer >= 2"});
  expect_objective_error(gspo("temperature=0"), {"objective.gspo.temperature = 0 is out of range"});
  expect_objective_error(gspo("logits_scale=-1"), {"objective.gspo.logits_scale = -1"});
  expect_objective_error(gspo("eps_low=1.5"), {"objective.gspo.eps_low = 1.5", "[0, 1)"});
  expect_objective_error(gspo("eps_high=-0.1"), {"objective.gspo.eps_high = -0.1"});
  expect_objective_error(gspo("updates_per_rollout=0"), {"objective.gspo.updates_per_rollout = 0"});
  expect_objective_error(gspo("ce_weight=-1"), {"objective.gspo.ce_weight = -1"});
  expect_objective_error(gspo("sampling=beam"),
                         {"objective.gspo.sampling = beam", "backbone, refinement"});
  expect_objective_error(gspo("reward=bleu"),
                         {"objective.gspo.reward = bleu", "greedy_match, expected_acceptance"});
  expect_objective_error(gspo("advantage_norm=none"),
                         {"objective.gspo.advantage_norm = none", "group_std, group_mean"});
  expect_objective_error(gspo("group_size=two"), {"objective.gspo.group_size = two"});
  expect_objective_error(gspo("grup_size=4"),
                         {"objective.gspo.grup_size: unknown key in objective.gspo; did you mean "
                          "objective.gspo.group_size?"});
  // GSPO samples anchors like DSpine: objective.dspine is checked too.
  expect_objective_error({"objective.name=gspo", "objective.dspine.num_anchors=0"},
                         {"objective.dspine.num_anchors = 0 is out of range"});
}

}  // namespace
}  // namespace dspine::train
