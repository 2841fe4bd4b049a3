// data.source: synthetic. Sample i is SyntheticTarget::sample(i): the batch depends only on the
// cursor, never on how earlier batches were grouped or which rank asked.
#pragma once

#include <cstdint>
#include <string>

#include "core/config.h"
#include "data/batch_source.h"
#include "data/synthetic_target.h"

namespace dspine::data {

class SyntheticSource : public BatchSource {
 public:
  // data.seq_len and data.synthetic; the draft's shapes from `draft` (model.*).
  SyntheticSource(const core::DataConfig& data, const core::ModelConfig& draft);

  DraftBatch next(int64_t rows) override;
  int64_t cursor() const override { return cursor_; }
  void seek(int64_t cursor) override;
  at::Tensor embed_tokens() const override { return target_.embed_tokens(); }
  at::Tensor lm_head() const override { return target_.lm_head(); }
  std::string describe() const override { return "the synthetic target"; }

 private:
  SyntheticTarget target_;
  int64_t seq_len_;
  int64_t cursor_ = 0;
};

}  // namespace dspine::data
