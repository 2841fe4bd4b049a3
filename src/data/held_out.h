// Which samples the acceptance evaluation measures, and whether the run trained on them
// (docs/evaluation.md, "Held-out rows"). The training data is read from global index 0 in order,
// wrapping around a finite file or directory, so the rows a run has read follow from its cursor.
#pragma once

#include <cstdint>
#include <string>

#include "core/config.h"
#include "data/batch_source.h"

namespace dspine::data {

struct HeldOutRows {
  std::string source;         // what they are read from (BatchSource::describe)
  bool separate = false;      // a data.eval_* source, which the run never reads
  int64_t offset = 0;         // global index of the first measured sample
  int64_t samples = 0;
  int64_t distinct = 0;       // distinct samples of the source; 0 = unbounded
  int64_t trained_rows = 0;   // global samples the run reads from the training source
  int64_t trained_on = 0;     // measured samples among them (0 for a separate source)

  // One line for logs: the rows, the source, and whether (how many of them) the run trained on.
  std::string describe() const;
};

// The `samples` samples from global index `offset` (core::eval_offset) of `held_out`, the separate
// source, or of `training` when it is null, for a run that has read `trained_rows` samples of
// `training` (from index 0, in order).
HeldOutRows held_out_rows(const BatchSource& training, const BatchSource* held_out,
                          int64_t trained_rows, int64_t offset, int64_t samples);

// The default held-out rows must be rows the run never reads: throws, saying what to set, when
// `rows` (from the default offset) include samples the run trains on.
void require_unread(const HeldOutRows& rows, const core::Config& config);

}  // namespace dspine::data
