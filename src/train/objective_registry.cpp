#include "train/objective_registry.h"

#include <algorithm>

#include <fmt/format.h>
#include <torch/torch.h>

#include "core/config_section.h"
#include "core/error.h"
#include "data/source_registry.h"
#include "model/simple_draft.h"
#include "objectives/ce_objective.h"
#include "objectives/dspine_objective.h"
#include "objectives/dspine_settings.h"
#include "objectives/gspo_objective.h"

namespace dspine::train {
namespace {

// config.json: the draft's, from its registry entry, with the objective's training settings and
// the target's special token ids.
nlohmann::json hf_config_of(const core::Config& config, const model::ResolvedDraft& draft,
                            const nlohmann::json& training_settings) {
  auto context = model::hf_config_context(config, training_settings);
  const auto ids = data::data_source_entry(config.data.source).target_token_ids(config);
  context.bos_token_id = ids.bos_token_id;
  context.eos_token_id = ids.eos_token_id;
  return draft.entry->hf_config(config.model, *draft.settings, context);
}

// ce has no settings: any key under objective.ce is unknown.
struct CeSettings final : ObjectiveSettings {};

std::shared_ptr<const ObjectiveSettings> parse_ce(const core::Config& config) {
  core::read_section(config, "objective.ce", {});
  return std::make_shared<CeSettings>();
}

BuiltModel build_ce(const core::Config& config, const ObjectiveSettings&,
                    const model::ResolvedDraft& draft, const data::BatchSource& source,
                    torch::Device device, torch::Dtype dtype) {
  auto module = std::dynamic_pointer_cast<model::SimpleDraftImpl>(
      draft.entry->build(config.model, *draft.settings, device, dtype));
  if (module == nullptr) fail("objective registry: ce trains the simple draft");
  auto lm_head = source.lm_head().to(device, dtype);
  BuiltModel built;
  built.module = module;
  built.objective = std::make_unique<objectives::CeObjective>(model::SimpleDraft(module), lm_head);
  built.hf_config = hf_config_of(config, draft, nlohmann::json::object());
  return built;
}

// The settings an entry's own parse made: its build function takes them back in their type.
template <typename Settings>
const Settings& settings_of(const ObjectiveSettings& settings) {
  const auto* typed = dynamic_cast<const Settings*>(&settings);
  if (typed == nullptr) fail("objective registry: a build was given another objective's settings");
  return *typed;
}

// A DSpine-draft objective (it owns its draft) as the trainer's BuiltModel, with an acceptance
// evaluator sharing that draft and its target tables.
template <typename DraftObjective>
BuiltModel built_from(const core::Config& config, const model::ResolvedDraft& draft,
                      std::unique_ptr<DraftObjective> objective) {
  BuiltModel built;
  built.module = objective->module();
  built.hf_config =
      hf_config_of(config, draft, objectives::dspine_settings_json(objective->dspine_settings()));
  auto& model = objective->training_model();
  built.acceptance = std::make_unique<objectives::AcceptanceEvaluator>(
      config, objective->dspine_settings(), objective->draft(), model.embed_tokens(),
      model.lm_head());
  built.objective = std::move(objective);
  return built;
}

struct DSpineObjectiveSettings final : ObjectiveSettings {
  objectives::DSpineSettings anchors;  // objective.dspine
  const objectives::DSpineSettings* dspine() const override { return &anchors; }
};

std::shared_ptr<const ObjectiveSettings> parse_dspine(const core::Config& config) {
  auto settings = std::make_shared<DSpineObjectiveSettings>();
  settings->anchors = objectives::read_dspine_settings(config);
  return settings;
}

BuiltModel build_dspine(const core::Config& config, const ObjectiveSettings& settings,
                        const model::ResolvedDraft& draft, const data::BatchSource& source,
                        torch::Device device, torch::Dtype dtype) {
  const auto& s = settings_of<DSpineObjectiveSettings>(settings);
  return built_from(config, draft,
                    objectives::make_dspine_objective(config, s.anchors, source.embed_tokens(),
                                                      source.lm_head(), device, dtype, &draft));
}

// GSPO samples its anchor blocks as the DSpine objective does: it reads both sections.
struct GspoObjectiveSettings final : ObjectiveSettings {
  objectives::DSpineSettings anchors;  // objective.dspine
  objectives::GspoSettings gspo;       // objective.gspo
  const objectives::DSpineSettings* dspine() const override { return &anchors; }
};

std::shared_ptr<const ObjectiveSettings> parse_gspo(const core::Config& config) {
  auto settings = std::make_shared<GspoObjectiveSettings>();
  settings->anchors = objectives::read_dspine_settings(config);
  settings->gspo = objectives::read_gspo_settings(config);
  return settings;
}

BuiltModel build_gspo(const core::Config& config, const ObjectiveSettings& settings,
                      const model::ResolvedDraft& draft, const data::BatchSource& source,
                      torch::Device device, torch::Dtype dtype) {
  const auto& s = settings_of<GspoObjectiveSettings>(settings);
  return built_from(config, draft,
                    objectives::make_gspo_objective(config, s.anchors, s.gspo,
                                                    source.embed_tokens(), source.lm_head(), device,
                                                    dtype, source.online_target(), &draft));
}

const std::vector<ObjectiveEntry>& registry() {
  static const std::vector<ObjectiveEntry> entries = {
      {"ce", "simple", parse_ce, build_ce},
      {"dspine", "dspine", parse_dspine, build_dspine},
      {"gspo", "dspine", parse_gspo, build_gspo},
  };
  return entries;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

std::vector<std::string> objective_names() {
  std::vector<std::string> names;
  for (const ObjectiveEntry& entry : registry()) names.push_back(entry.name);
  return names;
}

std::vector<core::KeyFacts> objective_key_facts() {
  std::vector<core::KeyFacts> facts;
  for (const ObjectiveEntry& entry : registry()) {
    // The default architecture, as the draft registry's key facts are recorded.
    core::Config defaults;
    defaults.objective.name = entry.name;
    core::SettingsRecorder recorder;
    entry.parse(defaults);
    for (const core::KeyFacts& key : recorder.facts()) {
      // An objective may read another's map too (gspo reads objective.dspine): list it once;
      // the architectures' maps are listed by the draft registry (model/draft_registry.h).
      const bool listed = std::any_of(facts.begin(), facts.end(),
                                      [&](const core::KeyFacts& f) { return f.key == key.key; });
      if (!listed && key.key.rfind("objective.", 0) == 0) facts.push_back(key);
    }
  }
  return facts;
}

namespace {

// resolve_objective with model.architecture's draft: `draft` when given, else parsed here once
// the objective's own checks have passed.
ResolvedObjective resolve_with(const core::Config& config, const model::ResolvedDraft* draft) {
  const std::vector<std::string> names = objective_names();
  const std::string& name = config.objective.name;
  const auto& entries = registry();
  const auto entry = std::find_if(entries.begin(), entries.end(),
                                  [&](const ObjectiveEntry& e) { return e.name == name; });
  if (entry == entries.end()) {
    std::string allowed = join(names);
    const std::string closest = core::closest_name(name, names);
    if (!closest.empty()) allowed += fmt::format(" (did you mean {}?)", closest);
    core::objective_range_error(config, "objective.name", name, allowed);
  }
  if (config.model.architecture != entry->architecture) {
    core::objective_range_error(config, "model.architecture", config.model.architecture,
                                fmt::format("{} (objective.name = {} trains the {} draft)",
                                            entry->architecture, name, entry->architecture));
  }
  for (const auto& [section, text] : config.objective.sections) {
    if (std::find(names.begin(), names.end(), section) == names.end()) {
      core::unknown_objective_section_error(config, section, names);
    }
  }
  model::ResolvedDraft resolved_draft = draft != nullptr ? *draft : model::resolve_draft(config);
  return {&*entry, entry->parse(config), std::move(resolved_draft)};
}

}  // namespace

ResolvedObjective resolve_objective(const core::Config& config) {
  return resolve_with(config, nullptr);
}

ResolvedObjective resolve_run(core::Config& config) {
  const model::ResolvedDraft draft = model::resolve_drafts(config);
  return resolve_with(config, &draft);
}

}  // namespace dspine::train
