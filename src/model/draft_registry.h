// The draft architectures, one entry each: its name (model.architecture, and the map
// model.<name> holding its own settings), the parse of that map, and what every tool asks of a
// draft: build it, load trained weights into it, write its config.json. The map model.<name> is
// declared by the architecture (core/settings.h) and listed in draft_sections(), so parse_config
// reads and checks it with core's keys. Adding an architecture is its model files plus one entry
// in draft_registry.cpp (docs/ARCHITECTURE.md, "Extension points").
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "model/dspine_config.h"

namespace torch::nn {
class Module;
}

namespace dspine::model {

// An architecture's settings as its entry's parse made them. Each entry has its own subclass
// (draft_registry.cpp); callers outside the registry ask what they need through the accessors.
struct DraftSettings {
  virtual ~DraftSettings() = default;
  // model.dspine as parsed, for the DSpine architecture; null for the others.
  virtual const DSpineConfig* dspine() const { return nullptr; }
};

struct DraftEntry {
  std::string name;  // model.architecture, and the map model.<name>
  core::SectionType section;  // the map model.<name>, for the catalog parse_config reads
  // The settings of model.<name> in a parsed configuration.
  std::shared_ptr<const DraftSettings> (*settings)(const core::Config& config);
  // A fresh draft of `model`'s sizes with `settings`, built on CPU fp32 from the global torch RNG,
  // with the kernels model.fused_kernels picks for `device`, then its parameters placed on
  // (device, dtype); buffers keep their own dtypes.
  std::shared_ptr<torch::nn::Module> (*build)(const core::ModelConfig& model,
                                              const DraftSettings& settings, c10::Device device,
                                              c10::ScalarType dtype);
  // Copies trained weights from `path` (a checkpoint or export directory, or a .safetensors file)
  // into a draft this entry built; errors name the file.
  void (*load)(torch::nn::Module& draft, const std::string& path);
  // The Hugging Face config.json of a draft of `model`'s sizes with `settings` (export and every
  // checkpoint); `context` is what a training run adds.
  nlohmann::json (*hf_config)(const core::ModelConfig& model, const DraftSettings& settings,
                              const HfConfigContext& context);
};

// A configuration's draft: its registry entry (model.architecture) and its parsed settings.
struct ResolvedDraft {
  const DraftEntry* entry = nullptr;
  std::shared_ptr<const DraftSettings> settings;
};

// Every registered model.architecture, in registry order.
std::vector<std::string> draft_names();

// The maps model.<name> of every architecture, in registry order, for parse_config's catalog.
core::SectionCatalog draft_sections();

// The draft of model.architecture, or of the architecture `name` when given, with its settings.
ResolvedDraft resolve_draft(const core::Config& config, const std::string& name = "");

// The DSpine draft's whole configuration: `model`'s shared keys with the settings' model.dspine.
// Throws when `settings` are another architecture's.
DSpineModelConfig dspine_model_config(const core::ModelConfig& model,
                                      const DraftSettings& settings);

}  // namespace dspine::model
