// The draft architectures, one entry each: its name (model.architecture, and the map
// model.<name> holding its own settings), the parse of that map, and what every tool asks of a
// draft: build it, load trained weights into it, write its config.json. Core keeps model.<name>
// as YAML text (core/config.h, ModelConfig::sections); the entry reads and checks it. Adding an
// architecture is its model files plus one entry in draft_registry.cpp (docs/ARCHITECTURE.md,
// "Extension points").
//
// A run parses model.<architecture> once (resolve_drafts in the tools, or resolve_draft): the
// build receives the settings typed and the built draft keeps them.
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
  // The map model.<name> with every setting resolved, as YAML text (what to_yaml writes); "" for
  // an architecture without settings.
  virtual std::string yaml() const { return ""; }
  // model.dspine as parsed, for the DSpine architecture; null for the others.
  virtual const DSpineConfig* dspine() const { return nullptr; }
};

struct DraftEntry {
  std::string name;  // model.architecture, and the map model.<name>
  // Reads model.<name> (core/config_section.h) into the settings, throwing config errors.
  std::shared_ptr<const DraftSettings> (*parse)(const core::Config& config);
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

// Parses every architecture's map (so a bad setting fails at start-up, whichever the
// architecture) and writes each back resolved, every setting with its value: to_yaml then writes
// what the run uses (checkpoints, --print-config; resume compares them). Returns the draft of
// model.architecture, as parsed here. Throws config errors.
ResolvedDraft resolve_drafts(core::Config& config);

// The draft of model.architecture, or of the architecture `name` when given: its entry's parse of
// its own map, alone (no write-back).
ResolvedDraft resolve_draft(const core::Config& config, const std::string& name = "");

// The DSpine draft's whole configuration: `model`'s shared keys with the settings' model.dspine.
// Throws when `settings` are another architecture's.
DSpineModelConfig dspine_model_config(const core::ModelConfig& model,
                                      const DraftSettings& settings);

// The settings of every architecture's map model.<name> (type, default, allowed values,
// description), recorded by running each entry's parse on a default configuration.
std::vector<core::KeyFacts> draft_key_facts();

}  // namespace dspine::model
