#include "objectives/dspine_settings.h"

#include <fmt/format.h>

#include "core/config_section.h"

namespace dspine::objectives {
namespace {

const char* const kSection = "dspine";

std::string key_of(const std::string& leaf) {
  return fmt::format("objective.{}.{}", kSection, leaf);
}

// dspine.md §2.2, in its order (types and finiteness are checked while reading).
void check_ranges(const core::Config& config, const DSpineSettings& s) {
  auto out_of_range = [&](const std::string& leaf, auto value, const std::string& allowed) {
    core::objective_range_error(config, key_of(leaf), fmt::format("{}", value), allowed);
  };
  if (s.num_anchors < 1) out_of_range("num_anchors", s.num_anchors, "integer >= 1");
  if (s.objective_chunk_blocks < 0) {
    out_of_range("objective_chunk_blocks", s.objective_chunk_blocks,
                 "integer >= 0 (0 = no chunking)");
  }
  const std::string weights_rule = "DSpine requires ce_weight in [0, 1] and alignment_weight >= 0";
  if (!(s.ce_weight >= 0 && s.ce_weight <= 1)) out_of_range("ce_weight", s.ce_weight, weights_rule);
  if (!(s.alignment_weight >= 0)) {
    out_of_range("alignment_weight", s.alignment_weight, weights_rule);
  }
  if (s.alignment_warmup_steps < 0) {
    out_of_range("alignment_warmup_steps", s.alignment_warmup_steps,
                 "DSpine warmup steps must be nonnegative");
  }
  if (!(s.replacement_probability >= 0 && s.replacement_probability <= 1)) {
    out_of_range("replacement_probability", s.replacement_probability,
                 "DSpine replacement_probability must be in [0, 1]");
  }
  const std::string ratio_rule = fmt::format(
      "DSpine requires 0 <= replacement_hold_ratio < replacement_end_ratio <= 1 (hold = {}, "
      "end = {})",
      s.replacement_hold_ratio, s.replacement_end_ratio);
  if (!(s.replacement_hold_ratio >= 0 && s.replacement_hold_ratio < s.replacement_end_ratio)) {
    out_of_range("replacement_hold_ratio", s.replacement_hold_ratio, ratio_rule);
  }
  if (!(s.replacement_end_ratio <= 1)) {
    out_of_range("replacement_end_ratio", s.replacement_end_ratio, ratio_rule);
  }
  if (!(s.candidate_mass_threshold >= 0 && s.candidate_mass_threshold < 1)) {
    out_of_range("candidate_mass_threshold", s.candidate_mass_threshold,
                 "DSpine candidate_mass_threshold must be in [0, 1)");
  }
}

}  // namespace

DSpineSettings read_dspine_settings(const core::Config& config) {
  DSpineSettings s;
  core::read_objective_section(config, kSection,
                               {
                                   {"num_anchors", &s.num_anchors},
                                   {"loss_decay_gamma", &s.loss_decay_gamma},
                                   {"objective_chunk_blocks", &s.objective_chunk_blocks},
                                   {"ce_weight", &s.ce_weight},
                                   {"alignment_weight", &s.alignment_weight},
                                   {"alignment_warmup_steps", &s.alignment_warmup_steps},
                                   {"replacement_probability", &s.replacement_probability},
                                   {"replacement_hold_ratio", &s.replacement_hold_ratio},
                                   {"replacement_end_ratio", &s.replacement_end_ratio},
                                   {"candidate_mass_threshold", &s.candidate_mass_threshold},
                               });
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
