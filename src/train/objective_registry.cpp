#include "train/objective_registry.h"

#include <algorithm>

#include <fmt/format.h>
#include <torch/torch.h>

#include "core/config_errors.h"
#include "core/error.h"
#include "data/source_registry.h"
#include "data/target_depth.h"
#include "model/simple_draft.h"
#include "objectives/ce_objective.h"
#include "objectives/dspine_objective.h"
#include "objectives/dspine_settings.h"
#include "objectives/gspo_objective.h"

namespace dspine::train {
namespace {

// What a training run adds to its draft's config.json: training.dtype, data.seq_len, and the
// target depth (model.num_target_layers, which the trainer resolves from the data source;
// unresolved, the least depth holding every target layer id).
model::HfConfigContext hf_config_context(const core::Config& run,
                                         const nlohmann::json& training_settings) {
  model::HfConfigContext context;
  context.dtype = run.training.dtype;
  context.training_settings = training_settings;
  // The trainer resolves the depth from the data source (data/target_depth.h); a configuration
  // used without it records the least depth holding every target layer id.
  context.num_target_layers = run.model.num_target_layers > 0
                                  ? run.model.num_target_layers
                                  : data::least_target_depth(run.model.target_layer_ids);
  context.max_position_embeddings = run.data.seq_len;
  return context;
}

// config.json: the draft's, from its registry entry, with the objective's training settings and
// the target's special token ids.
nlohmann::json hf_config_of(const core::Config& config, const model::ResolvedDraft& draft,
                            const nlohmann::json& training_settings) {
  auto context = hf_config_context(config, training_settings);
  const auto ids = data::data_source_entry(config.data.source).target_token_ids(config);
  context.bos_token_id = ids.bos_token_id;
  context.eos_token_id = ids.eos_token_id;
  return draft.entry->hf_config(config.model, *draft.settings, context);
}

// ce has no settings: any key under objective.ce is unknown.
struct CeSettings final : ObjectiveSettings {};

std::shared_ptr<const ObjectiveSettings> ce_settings(const core::Config&) {
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
      objective->dspine_settings(), config.data.seq_len,
      static_cast<uint64_t>(config.training.seed), objective->draft(), model.embed_tokens(),
      model.lm_head());
  built.objective = std::move(objective);
  return built;
}

struct DSpineObjectiveSettings final : ObjectiveSettings {
  objectives::DSpineSettings anchors;  // objective.dspine
  const objectives::DSpineSettings* dspine() const override { return &anchors; }
};

const char* const kDSpineMap = "objective.dspine";
const char* const kGspoMap = "objective.gspo";

std::shared_ptr<const ObjectiveSettings> dspine_settings(const core::Config& config) {
  auto settings = std::make_shared<DSpineObjectiveSettings>();
  settings->anchors = config.section<objectives::DSpineSettings>(kDSpineMap);
  return settings;
}

BuiltModel build_dspine(const core::Config& config, const ObjectiveSettings& settings,
                        const model::ResolvedDraft& draft, const data::BatchSource& source,
                        torch::Device device, torch::Dtype dtype) {
  const auto& s = settings_of<DSpineObjectiveSettings>(settings);
  return built_from(
      config, draft,
      objectives::make_dspine_objective(model::dspine_model_config(config.model, *draft.settings),
                                        s.anchors, config.training.accumulation_steps,
                                        source.embed_tokens(), source.lm_head(), device, dtype));
}

// GSPO samples its anchor blocks as the DSpine objective does: it reads both sections.
struct GspoObjectiveSettings final : ObjectiveSettings {
  objectives::DSpineSettings anchors;  // objective.dspine
  objectives::GspoSettings gspo;       // objective.gspo
  const objectives::DSpineSettings* dspine() const override { return &anchors; }
};

std::shared_ptr<const ObjectiveSettings> gspo_settings(const core::Config& config) {
  auto settings = std::make_shared<GspoObjectiveSettings>();
  settings->anchors = config.section<objectives::DSpineSettings>(kDSpineMap);
  settings->gspo = config.section<objectives::GspoSettings>(kGspoMap);
  return settings;
}

BuiltModel build_gspo(const core::Config& config, const ObjectiveSettings& settings,
                      const model::ResolvedDraft& draft, const data::BatchSource& source,
                      torch::Device device, torch::Dtype dtype) {
  const auto& s = settings_of<GspoObjectiveSettings>(settings);
  return built_from(config, draft,
                    objectives::make_gspo_objective(
                        model::dspine_model_config(config.model, *draft.settings), s.anchors,
                        s.gspo, config.training.accumulation_steps, source.embed_tokens(),
                        source.lm_head(), device, dtype, source.online_target()));
}

const std::vector<ObjectiveEntry>& registry() {
  static const std::vector<ObjectiveEntry> entries = {
      {"ce", "simple", core::section_type<core::NoSettings>("objective.ce"), ce_settings, build_ce},
      {"dspine", "dspine", core::section_type<objectives::DSpineSettings>(kDSpineMap),
       dspine_settings, build_dspine},
      {"gspo", "dspine", core::section_type<objectives::GspoSettings>(kGspoMap), gspo_settings,
       build_gspo},
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

core::SectionCatalog objective_sections() {
  core::SectionCatalog sections;
  for (const ObjectiveEntry& entry : registry()) sections.push_back(entry.section);
  return sections;
}

ResolvedObjective resolve_run(const core::Config& config) {
  const std::vector<std::string> names = objective_names();
  const std::string& name = config.objective.name;
  const auto& entries = registry();
  const auto entry = std::find_if(entries.begin(), entries.end(),
                                  [&](const ObjectiveEntry& e) { return e.name == name; });
  if (entry == entries.end()) {
    std::string allowed = join(names);
    const std::string closest = core::closest_name(name, names);
    if (!closest.empty()) allowed += fmt::format(" (did you mean {}?)", closest);
    core::range_error(config, "objective.name", name, allowed);
  }
  if (config.model.architecture != entry->architecture) {
    core::range_error(config, "model.architecture", config.model.architecture,
                      fmt::format("{} (objective.name = {} trains the {} draft)",
                                  entry->architecture, name, entry->architecture));
  }
  return {&*entry, entry->settings(config), model::resolve_draft(config)};
}

BuiltModel build_model(const core::Config& config, const ResolvedObjective& objective,
                       const data::BatchSource& source, torch::Device device, torch::Dtype dtype) {
  BuiltModel built =
      objective.entry->build(config, *objective.settings, objective.draft, source, device, dtype);
  built.settings = objective.settings;
  built.draft = objective.draft;
  return built;
}

}  // namespace dspine::train
