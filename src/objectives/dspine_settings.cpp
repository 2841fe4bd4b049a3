#include "objectives/dspine_settings.h"

namespace dspine::objectives {

core::Settings settings_of(DSpineSettings& s, const core::Config&) {
  const std::string weights_rule = "DSpine requires ce_weight in [0, 1] and alignment_weight >= 0";
  const std::string ratio_rule =
      "DSpine requires 0 <= replacement_hold_ratio < replacement_end_ratio <= 1";
  return {
      {"num_anchors", &s.num_anchors, core::at_least(s.num_anchors, 1),
       "most anchor blocks sampled per row"},
      {"loss_decay_gamma", &s.loss_decay_gamma,
       core::documented("any number; <= 0 disables the decay"),
       "gamma of the loss decay over block positions"},
      {"objective_chunk_blocks", &s.objective_chunk_blocks,
       core::require(
           s.objective_chunk_blocks, [](int64_t v) { return v >= 0; },
           "integer >= 0 (0 = no chunking)"),
       "blocks per checkpointed objective chunk"},
      {"ce_weight", &s.ce_weight,
       core::require(
           s.ce_weight, [](double v) { return v >= 0 && v <= 1; }, weights_rule),
       "refinement term: weight of its CE against its L1"},
      {"alignment_weight", &s.alignment_weight,
       core::require(
           s.alignment_weight, [](double v) { return v >= 0; }, weights_rule),
       "final weight of the alignment term"},
      {"alignment_warmup_steps", &s.alignment_warmup_steps,
       core::require(
           s.alignment_warmup_steps, [](int64_t v) { return v >= 0; },
           "DSpine warmup steps must be nonnegative"),
       "steps over which the alignment weight ramps up"},
      {"replacement_probability", &s.replacement_probability,
       core::require(
           s.replacement_probability, [](double v) { return v >= 0 && v <= 1; },
           "DSpine replacement_probability must be in [0, 1]"),
       "start chance a block's predecessors are true codes"},
      {"replacement_hold_ratio", &s.replacement_hold_ratio,
       core::require(
           s.replacement_hold_ratio,
           [end = &s.replacement_end_ratio](double v) { return v >= 0 && v < *end; }, ratio_rule),
       "progress at which replacement starts to fade"},
      {"replacement_end_ratio", &s.replacement_end_ratio,
       core::require(
           s.replacement_end_ratio, [](double v) { return v <= 1; }, ratio_rule),
       "progress at which replacement has faded out"},
      {"candidate_mass_threshold", &s.candidate_mass_threshold,
       core::require(
           s.candidate_mass_threshold, [](double v) { return v >= 0 && v < 1; },
           "DSpine candidate_mass_threshold must be in [0, 1)"),
       "teacher mass the top-k needs for the refinement L1"},
      {"prepass",
       core::choice_target(&s.prepass),
       {},
       "window micro-batches given a prepass, and which keeps it"},
  };
}

nlohmann::json dspine_settings_json(const DSpineSettings& s) {
  return {
      {"ce_weight", s.ce_weight},
      {"alignment_weight", s.alignment_weight},
      {"alignment_warmup_steps", s.alignment_warmup_steps},
      {"replacement_probability", s.replacement_probability},
      {"replacement_hold_ratio", s.replacement_hold_ratio},
      {"replacement_end_ratio", s.replacement_end_ratio},
      {"candidate_mass_threshold", s.candidate_mass_threshold},
  };
}

}  // namespace dspine::objectives
