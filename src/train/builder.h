// Composes the draft model and its objective from the configuration: the objective registry
// (objective_registry.h) entry of objective.name builds both, so the trainer never branches on
// either.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/types.h>

#include "core/config.h"
#include "data/batch_source.h"
#include "model/draft_registry.h"
#include "objectives/acceptance.h"
#include "objectives/objective.h"

namespace dspine::train {

struct ObjectiveSettings;  // train/objective_registry.h
struct ResolvedObjective;  // train/objective_registry.h

struct BuiltModel {
  std::shared_ptr<torch::nn::Module> module;  // trainable parameters + buffers (checkpoint keys)
  std::unique_ptr<objectives::Objective> objective;
  nlohmann::json hf_config;                   // written as config.json
  // Measures acceptance on held-out samples (training.eval_every); null for non-DSpine drafts.
  std::unique_ptr<objectives::AcceptanceEvaluator> acceptance;
  // The objective's settings as resolve_run found them (what built the objective).
  std::shared_ptr<const ObjectiveSettings> settings;
  // The draft's registry entry and settings (what built `module`; it loads trained weights).
  model::ResolvedDraft draft;
};

// Draft and objective of an objective already resolved from `config` (resolve_run). Parameters are
// created in `dtype`; buffers keep their own dtype (e.g. fp32 transfer codes).
BuiltModel build_model(const core::Config& config, const ResolvedObjective& objective,
                       const data::BatchSource& source, torch::Device device, torch::Dtype dtype);

}  // namespace dspine::train
