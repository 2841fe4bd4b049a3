#include "data/synthetic_source.h"

#include <torch/torch.h>

#include <vector>

#include "core/error.h"

namespace dspine::data {

SyntheticSource::SyntheticSource(const core::DataConfig& data, const core::ModelConfig& draft)
    : target_(draft, data.synthetic), seq_len_(data.seq_len) {}

DraftBatch SyntheticSource::next(int64_t rows) {
  if (rows < 1) fail("synthetic source: rows must be >= 1 (got {})", rows);
  // Rows are independent samples: one per thread, each computed serially inside the region.
  std::vector<DraftBatch> samples(static_cast<size_t>(rows));
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) samples[i] = target_.sample(cursor_ + i, seq_len_);
  });
  cursor_ += rows;
  return concat_rows(samples);
}

void SyntheticSource::seek(int64_t cursor) {
  if (cursor < 0) fail("synthetic source: cursor must be >= 0 (got {})", cursor);
  cursor_ = cursor;
}

}  // namespace dspine::data
