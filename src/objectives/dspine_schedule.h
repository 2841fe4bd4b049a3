// DSpine schedules (docs/model.md, "Schedules"): alignment weight β with linear warmup and the
// replacement probability p, held until hold_ratio of the horizon, linear to 0 at end_ratio.
#pragma once

#include <cstdint>

#include "objectives/dspine_settings.h"

namespace dspine::objectives {

struct DSpineSchedule {
  double alignment_beta = 0;
  double replacement_probability = 0;
};

// step = completed optimizer steps; total_steps <= 0 means no horizon (p = 0).
DSpineSchedule dspine_schedule(const DSpineSettings& settings, int64_t step, int64_t total_steps);

}  // namespace dspine::objectives
