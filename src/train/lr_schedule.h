// training.lr_scheduler cosine (docs/config.md): linear warmup over int(warmup_ratio * total_steps)
// steps, then cosine annealing from the base rate to 0 over the remaining steps (or a constant rate
// after warmup).
#pragma once

#include <cstdint>

#include "core/config.h"

namespace dspine::train {

class LrSchedule {
 public:
  LrSchedule(double base_lr, int64_t total_steps, double warmup_ratio, core::LrScheduler kind);
  // The rate used by optimizer step `step` (0-based).
  double at(int64_t step) const;
  int64_t warmup_steps() const { return warmup_steps_; }

 private:
  double base_lr_;
  int64_t total_steps_;
  int64_t warmup_steps_;
  core::LrScheduler kind_;
};

}  // namespace dspine::train
