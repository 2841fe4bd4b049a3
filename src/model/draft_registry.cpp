#include "model/draft_registry.h"

#include <torch/torch.h>

#include "core/error.h"
#include "core/safetensors.h"
#include "model/draft_loading.h"
#include "model/dspine_draft.h"
#include "model/module_state.h"
#include "model/simple_draft.h"

namespace dspine::model {
namespace {

// The simple draft has no settings: any key under model.simple is unknown.
struct SimpleSettings final : DraftSettings {};

std::shared_ptr<const DraftSettings> simple_settings(const core::Config&) {
  return std::make_shared<SimpleSettings>();
}

std::shared_ptr<torch::nn::Module> build_simple(const core::ModelConfig& model,
                                                const DraftSettings&, c10::Device device,
                                                c10::ScalarType dtype) {
  SimpleDraft draft(model, use_fused_kernels(model.fused_kernels, device));
  torch::NoGradGuard no_grad;
  draft->to(device);
  for (auto& parameter : draft->parameters()) parameter.set_data(parameter.to(dtype));
  return draft.ptr();
}

// Strict: the draft's own keys and shapes.
void load_simple(torch::nn::Module& draft, const std::string& path) {
  load_module_state(draft, core::load_safetensors(weights_file(path)));
}

nlohmann::json simple_hf_config(const core::ModelConfig& model, const DraftSettings&,
                                const HfConfigContext&) {
  return {{"architectures", {"SimpleDraftModel"}},
          {"model_type", "dspine-simple"},
          {"hidden_size", model.hidden_size},
          {"intermediate_size", model.intermediate_size},
          {"num_hidden_layers", model.num_hidden_layers},
          {"vocab_size", model.vocab_size},
          {"rms_norm_eps", model.rms_norm_eps},
          {"target_layer_ids", model.target_layer_ids}};
}

const char* const kDSpineMap = "model.dspine";

struct DSpineDraftSettings final : DraftSettings {
  DSpineConfig settings;  // model.dspine
  const DSpineConfig* dspine() const override { return &settings; }
};

std::shared_ptr<const DraftSettings> dspine_settings(const core::Config& config) {
  auto settings = std::make_shared<DSpineDraftSettings>();
  settings->settings = config.section<DSpineConfig>(kDSpineMap);
  return settings;
}

std::shared_ptr<torch::nn::Module> build_dspine(const core::ModelConfig& model,
                                                const DraftSettings& settings, c10::Device device,
                                                c10::ScalarType dtype) {
  return build_placed_draft(dspine_model_config(model, settings), device, dtype).ptr();
}

DSpineDraftImpl& as_dspine(torch::nn::Module& draft) {
  auto* dspine = dynamic_cast<DSpineDraftImpl*>(&draft);
  if (dspine == nullptr) fail("draft registry: the dspine entry was given another draft");
  return *dspine;
}

void load_dspine(torch::nn::Module& draft, const std::string& path) {
  load_draft(as_dspine(draft), path);
}

nlohmann::json dspine_hf(const core::ModelConfig& model, const DraftSettings& settings,
                         const HfConfigContext& context) {
  return dspine_hf_config(dspine_model_config(model, settings), context);
}

// One entry per name of core::architecture_names(), in its order (a model test checks both).
const std::vector<DraftEntry>& registry() {
  static const std::vector<DraftEntry> entries = {
      {"simple", core::section_type<core::NoSettings>("model.simple"), simple_settings,
       build_simple, load_simple, simple_hf_config},
      {"dspine", core::section_type<DSpineConfig>(kDSpineMap), dspine_settings, build_dspine,
       load_dspine, dspine_hf},
  };
  return entries;
}

// parse_config already checked model.architecture against core::architecture_names().
const DraftEntry& entry_named(const std::string& name) {
  for (const DraftEntry& entry : registry()) {
    if (entry.name == name) return entry;
  }
  fail("model.architecture '{}' has no draft registry entry", name);
}

}  // namespace

std::vector<std::string> draft_names() {
  std::vector<std::string> names;
  for (const DraftEntry& entry : registry()) names.push_back(entry.name);
  return names;
}

core::SectionCatalog draft_sections() {
  core::SectionCatalog sections;
  for (const DraftEntry& entry : registry()) sections.push_back(entry.section);
  return sections;
}

ResolvedDraft resolve_draft(const core::Config& config, const std::string& name) {
  const DraftEntry& entry = entry_named(name.empty() ? config.model.architecture : name);
  return {&entry, entry.settings(config)};
}

DSpineModelConfig dspine_model_config(const core::ModelConfig& model,
                                      const DraftSettings& settings) {
  if (settings.dspine() == nullptr) {
    fail("model.architecture '{}': a DSpine draft needs the dspine architecture's settings",
         model.architecture);
  }
  return {model, *settings.dspine()};
}

}  // namespace dspine::model
