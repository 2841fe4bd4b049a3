#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace dspine::train {

LrSchedule::LrSchedule(double base_lr, int64_t total_steps, double warmup_ratio,
                       core::LrScheduler kind)
    : base_lr_(base_lr),
      total_steps_(total_steps),
      warmup_steps_(static_cast<int64_t>(warmup_ratio * static_cast<double>(total_steps))),
      kind_(kind) {}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps_) {
    return base_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
  }
  if (kind_ == core::LrScheduler::kConstant) return base_lr_;
  // Closed form of CosineAnnealingLR (eta_min 0): the first post-warmup step keeps the base rate.
  const double horizon = static_cast<double>(std::max<int64_t>(total_steps_ - warmup_steps_, 1));
  const double t = static_cast<double>(step - warmup_steps_);
  return base_lr_ * 0.5 * (1.0 + std::cos(M_PI * std::min(t, horizon) / horizon));
}

}  // namespace dspine::train
