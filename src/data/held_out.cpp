#include "data/held_out.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "data/source_registry.h"

namespace dspine::data {

HeldOutRows held_out_rows(const BatchSource& training, const BatchSource* held_out,
                          int64_t trained_rows, int64_t offset, int64_t samples) {
  HeldOutRows rows;
  const BatchSource& source = held_out ? *held_out : training;
  rows.source = source.describe();
  rows.separate = held_out != nullptr;
  rows.offset = offset;
  rows.samples = samples;
  rows.distinct = source.distinct_samples();
  rows.trained_rows = trained_rows;
  if (rows.separate) return rows;
  // Sample i is row i mod distinct: the run has read the rows below min(trained_rows, distinct).
  const int64_t n = rows.distinct;
  for (int64_t k = 0; k < samples; ++k) {
    const int64_t index = rows.offset + k;
    const bool read = n > 0 ? (trained_rows >= n || index % n < trained_rows)
                            : index < trained_rows;
    rows.trained_on += read ? 1 : 0;
  }
  return rows;
}

std::string HeldOutRows::describe() const {
  const int64_t last = offset + samples - 1;
  std::string where = fmt::format("samples {}..{} of {}", offset, last, source);
  if (distinct > 0 && last >= distinct) {
    where += fmt::format(" ({} distinct: indices wrap around)", distinct);
  }
  if (separate) return where + ", a held-out source the run never reads";
  if (trained_on == 0) {
    return where + fmt::format(", none of them among the {} the run trains on", trained_rows);
  }
  return where + fmt::format(", {} of them among the {} the run trains on: NOT held out",
                             trained_on, trained_rows);
}

void require_unread(const HeldOutRows& rows, const core::Config& config) {
  if (rows.trained_on == 0) return;
  const std::string key = data_source_entry(config.data.source).held_out_key;
  if (key.empty()) {  // an endless source: its later samples are never read
    fail("the acceptance evaluation has no held-out rows: {} of the samples {}..{} of {} are among "
         "the {} the run trains on. Set data.eval_offset to at least {}",
         rows.trained_on, rows.offset, rows.offset + rows.samples - 1, rows.source,
         rows.trained_rows, rows.trained_rows);
  }
  const int64_t unread = std::max<int64_t>(rows.distinct - rows.trained_rows, 0);
  fail("the acceptance evaluation has no held-out rows: {} holds {} samples and the run's "
       "training.total_steps = {} read {} (steps x accumulation_steps x batch_size x ranks), "
       "leaving {} never read, fewer than data.eval_samples = {}. Set {} to a separate held-out "
       "set, or lower data.eval_samples or training.total_steps",
       rows.source, rows.distinct, config.training.total_steps, rows.trained_rows, unread,
       rows.samples, key);
}

}  // namespace dspine::data
