#include "objectives/dspine_schedule.h"

#include <algorithm>

namespace dspine::objectives {

DSpineSchedule dspine_schedule(const DSpineSettings& c, int64_t step, int64_t total_steps) {
  const double progress_steps = static_cast<double>(std::max<int64_t>(step, 0));
  DSpineSchedule s;
  s.alignment_beta =
      c.alignment_warmup_steps == 0
          ? c.alignment_weight
          : c.alignment_weight *
                std::min(progress_steps / static_cast<double>(c.alignment_warmup_steps), 1.0);
  if (total_steps > 0) {
    const double progress = progress_steps / static_cast<double>(total_steps);
    const double f =
        (c.replacement_end_ratio - progress) / (c.replacement_end_ratio - c.replacement_hold_ratio);
    s.replacement_probability = c.replacement_probability * std::clamp(f, 0.0, 1.0);
  }
  return s;
}

}  // namespace dspine::objectives
