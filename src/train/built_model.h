// What the objective registry's entry of objective.name builds (train/objective_registry.h,
// build_model): the draft model and its objective, so the trainer never branches on either.
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

struct BuiltModel {
  std::shared_ptr<torch::nn::Module> module;  // trainable parameters + buffers (checkpoint keys)
  std::unique_ptr<objectives::Objective> objective;
  nlohmann::json hf_config;  // written as config.json
  // Measures acceptance on held-out samples (training.eval_every); null for non-DSpine drafts.
  std::unique_ptr<objectives::AcceptanceEvaluator> acceptance;
  // The objective's settings as resolve_run found them (what built the objective).
  std::shared_ptr<const ObjectiveSettings> settings;
  // The draft's registry entry and settings (what built `module`; it loads trained weights).
  model::ResolvedDraft draft;
};

}  // namespace dspine::train
