// The DSpine objective's training settings, the map objective.dspine (docs/config.md, docs/model.md
// "The supervised objective"; the reference's names and defaults). The draft's own keys stay in
// model.dspine.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/settings.h"

namespace dspine::objectives {

// Which micro-batches of an accumulation window get a CE-only prepass: all of them (the
// reference's scheme), or all but the first (the first micro-batch's replay completes CE̅ itself;
// same losses and gradients, one CE-only forward fewer per window), or keep_last: as skip_first,
// and the last micro-batch's prepass runs with autograd and is kept as the first half of its
// replay (no CE-only forward at A = 2; one micro-batch's activations held through the other
// replays). docs/model.md, "CE-only prepass and replay".
enum class DSpinePrepass { kAll, kSkipFirst, kKeepLast };
constexpr std::array<core::Choice<DSpinePrepass>, 3> choices_of(DSpinePrepass) {
  return {{{DSpinePrepass::kAll, "all"},
           {DSpinePrepass::kSkipFirst, "skip_first"},
           {DSpinePrepass::kKeepLast, "keep_last"}}};
}

struct DSpineSettings {
  int64_t num_anchors = 512;             // max anchor blocks per row
  double loss_decay_gamma = 7.0;         // position decay; <= 0 disables
  int64_t objective_chunk_blocks = 128;  // blocks per objective chunk; 0 = no chunking
  double ce_weight = 0.1;
  double alignment_weight = 0.5;
  int64_t alignment_warmup_steps = 146;
  double replacement_probability = 0.5;
  double replacement_hold_ratio = 1.0 / 6.0;
  double replacement_end_ratio = 1.0 / 3.0;
  double candidate_mass_threshold = 1e-4;
  DSpinePrepass prepass = DSpinePrepass::kAll;  // objective.dspine.prepass: all | skip_first |
                                                // keep_last
};

// The declaration of objective.dspine (core/settings.h); errors name the full key, e.g.
// objective.dspine.num_anchors, and the DSpine rule it broke.
core::Settings settings_of(DSpineSettings& settings, const core::Config& run);

// The settings under their reference names, for config.json's dspine_config (with the model's).
nlohmann::json dspine_settings_json(const DSpineSettings& settings);

}  // namespace dspine::objectives
