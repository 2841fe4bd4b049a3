#include "objectives/dspine_settings.h"

#include <fmt/format.h>

#include "core/config_section.h"

namespace dspine::objectives {
namespace {

const char* const kSection = "objective.dspine";

std::string key_of(const std::string& leaf) { return fmt::format("{}.{}", kSection, leaf); }

// The reference's checks in its order (docs/config.md, objective.dspine); types and finiteness are
// checked while reading. Each rule is also what docs/config.md lists for its key.
void check_ranges(const core::Config& config, const DSpineSettings& s) {
  auto require = [&](const std::string& leaf, bool ok, auto value, const std::string& allowed) {
    core::check_setting(config, key_of(leaf), ok, fmt::format("{}", value), allowed);
  };
  require("num_anchors", s.num_anchors >= 1, s.num_anchors, "integer >= 1");
  require("loss_decay_gamma", true, s.loss_decay_gamma, "any number; <= 0 disables the decay");
  require("objective_chunk_blocks", s.objective_chunk_blocks >= 0, s.objective_chunk_blocks,
          "integer >= 0 (0 = no chunking)");
  const std::string weights_rule = "DSpine requires ce_weight in [0, 1] and alignment_weight >= 0";
  require("ce_weight", s.ce_weight >= 0 && s.ce_weight <= 1, s.ce_weight, weights_rule);
  require("alignment_weight", s.alignment_weight >= 0, s.alignment_weight, weights_rule);
  require("alignment_warmup_steps", s.alignment_warmup_steps >= 0, s.alignment_warmup_steps,
          "DSpine warmup steps must be nonnegative");
  require("replacement_probability",
          s.replacement_probability >= 0 && s.replacement_probability <= 1,
          s.replacement_probability, "DSpine replacement_probability must be in [0, 1]");
  const std::string ratio_rule =
      "DSpine requires 0 <= replacement_hold_ratio < replacement_end_ratio <= 1";
  require("replacement_hold_ratio",
          s.replacement_hold_ratio >= 0 && s.replacement_hold_ratio < s.replacement_end_ratio,
          s.replacement_hold_ratio, ratio_rule);
  require("replacement_end_ratio", s.replacement_end_ratio <= 1, s.replacement_end_ratio,
          ratio_rule);
  require("candidate_mass_threshold",
          s.candidate_mass_threshold >= 0 && s.candidate_mass_threshold < 1,
          s.candidate_mass_threshold, "DSpine candidate_mass_threshold must be in [0, 1)");
}

}  // namespace

DSpineSettings read_dspine_settings(const core::Config& config) {
  DSpineSettings s;
  std::string prepass = "all";
  core::read_section(config, kSection,
                     {
                         {"num_anchors", &s.num_anchors, {}, false,
                          "most anchor blocks sampled per row"},
                         {"loss_decay_gamma", &s.loss_decay_gamma, {}, false,
                          "gamma of the loss decay over block positions"},
                         {"objective_chunk_blocks", &s.objective_chunk_blocks, {},
                          false, "blocks per checkpointed objective chunk"},
                         {"ce_weight", &s.ce_weight, {}, false,
                          "refinement term: weight of its CE against its L1"},
                         {"alignment_weight", &s.alignment_weight, {}, false,
                          "final weight of the alignment term"},
                         {"alignment_warmup_steps", &s.alignment_warmup_steps, {},
                          false, "steps over which the alignment weight ramps up"},
                         {"replacement_probability", &s.replacement_probability, {},
                          false, "start chance a block's predecessors are true codes"},
                         {"replacement_hold_ratio", &s.replacement_hold_ratio, {},
                          false, "progress at which replacement starts to fade"},
                         {"replacement_end_ratio", &s.replacement_end_ratio, {}, false,
                          "progress at which replacement has faded out"},
                         {"candidate_mass_threshold", &s.candidate_mass_threshold, {},
                          false, "teacher mass the top-k needs for the refinement L1"},
                         {"prepass", &prepass, {"all", "skip_first", "keep_last"}, false,
                          "window micro-batches given a prepass, and which keeps it"},
                     });
  s.prepass = prepass == "skip_first"  ? DSpinePrepass::kSkipFirst
              : prepass == "keep_last" ? DSpinePrepass::kKeepLast
                                       : DSpinePrepass::kAll;
  check_ranges(config, s);
  return s;
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
