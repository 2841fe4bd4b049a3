// data.source: random — inputs of the configured shapes filled with seeded random values,
// generated directly on the training device, for benchmarks at sizes where the CPU synthetic
// target is far too slow. The values carry no signal; only shapes, dtypes and cost are real.
#pragma once

#include <cstdint>

#include <c10/core/Device.h>

#include "core/config.h"
#include "data/batch_source.h"

namespace dspine::data {

// Sample i (a pure function of data.synthetic.seed, i and the device type; CUDA and CPU streams
// differ): input_ids uniform over the vocabulary except the mask token; loss_mask 0 over the
// first data.synthetic.prompt_length positions, then 1; hidden_states [S, K*H] and
// target_last_hidden_states [S, H] standard normal fp32. embed_tokens / lm_head are [V, H] fp32
// normal with std kWeightStd, regenerated on every call rather than held, so a benchmark's
// device memory holds only what the trainer keeps.
class RandomSource : public BatchSource {
 public:
  // At H = 4096 this gives logits of std ~1.3 for unit-normal final states.
  static constexpr double kWeightStd = 0.02;

  // data.seq_len and data.synthetic's seed and prompt length; the shapes from `draft` (model.*).
  RandomSource(const core::DataConfig& data, const core::ModelConfig& draft,
               const c10::Device& device);

  DraftBatch next(int64_t rows) override;
  int64_t cursor() const override { return cursor_; }
  void seek(int64_t cursor) override;
  at::Tensor embed_tokens() const override;
  at::Tensor lm_head() const override;
  std::string describe() const override { return "random values (data.source random)"; }

 private:
  at::Tensor weight(int64_t stream) const;

  c10::Device device_;
  int64_t seed_, seq_len_, prompt_length_, vocab_, hidden_, features_, mask_id_;
  int64_t cursor_ = 0;
};

}  // namespace dspine::data
