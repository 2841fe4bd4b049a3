// data.source: target — a real Qwen3 target (a Hugging Face directory, or seeded random weights
// of its config.json's shape) run online on the training device over token samples; docs/data.md.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/ScalarType.h>
#include <c10/core/Stream.h>

#include "core/config.h"
#include "data/batch_source.h"
#include "target/qwen3_model.h"
#include "data/token_samples.h"

namespace dspine::data {

// The dtype the target runs in: bf16 on CUDA when training.dtype is bf16, else fp32 — the
// draft's own dtype, so the embedding and lm_head it freezes are the target's tensors.
at::ScalarType target_dtype(core::Dtype training_dtype, const c10::Device& device);

// data.target.path loaded (or, with data.target.random, seeded from data.target.seed in the shape
// of its config.json) in `dtype` on `device`, checked against the draft's model.hidden_size,
// model.vocab_size and model.target_layer_ids (errors name config.json and the key).
target::Qwen3Model load_target(const core::TargetModelConfig& target,
                               const core::ModelConfig& draft, at::ScalarType dtype,
                               const c10::Device& device);

// Sample i: row i of data.samples (wrapping around: epochs), cut to data.seq_len or padded with
// token 0 and loss 0; without a samples file, seeded random token ids (a pure function of
// data.target.seed and i) with loss 0 over the first data.synthetic.prompt_length positions.
// Batches live on the device, hidden states in the target's dtype. embed_tokens() / lm_head()
// hand out the target's own tensors, never copies. With data.target.prefetch, prefetch() runs
// the target ahead (on CUDA on a stream of its own; docs/data.md, "Online target").
class TargetSource : public BatchSource {
 public:
  // The target of data.target in `dtype` (target_dtype) on `device`, serving data.samples as
  // above; the draft's shapes and target layers from `draft` (model.*).
  TargetSource(const core::DataConfig& data, const core::ModelConfig& draft, at::ScalarType dtype,
               const c10::Device& device);
  // The same target (shared weights, no second load) over another token-sample file: the
  // held-out source of data.eval_samples_file.
  TargetSource(const TargetSource& training, const std::string& samples_path);

  DraftBatch next(int64_t rows) override;
  void prefetch(int64_t cursor, int64_t rows) override;
  // Batches computed ahead and not read yet.
  size_t batches_ahead() const { return prefetched_.size(); }
  int64_t cursor() const override { return cursor_; }
  void seek(int64_t cursor) override;
  at::Tensor embed_tokens() const override { return model_.embed_tokens(); }
  at::Tensor lm_head() const override { return model_.lm_head(); }

  const target::Qwen3Model& model() const { return model_; }
  const target::Qwen3Model* online_target() const override { return &model_; }
  int64_t distinct_samples() const override { return samples_ ? samples_->size() : 0; }
  std::string describe() const override;

 private:
  // A batch computed ahead; `ready` is recorded on the side stream after its last kernel.
  struct Prefetched {
    int64_t cursor, rows;
    DraftBatch batch;
    std::optional<c10::Event> ready;
  };

  DraftBatch random_tokens(int64_t cursor, int64_t rows) const;
  // The batch of `rows` samples from `cursor` on, computed on the current stream.
  DraftBatch compute(int64_t cursor, int64_t rows);
  // The batch computed ahead for that cursor and row count, or prefetched_.end().
  std::vector<Prefetched>::iterator computed_ahead(int64_t cursor, int64_t rows);

  c10::Device device_;
  target::Qwen3Model model_;
  std::vector<int64_t> layer_ids_;
  std::optional<TokenSamples> samples_;
  int64_t seq_len_, seed_, prompt_length_, vocab_, mask_id_;
  int64_t cursor_ = 0;
  bool prefetch_;
  std::vector<Prefetched> prefetched_;  // oldest first, at most kMaxPrefetched
  std::optional<c10::Stream> side_stream_;
};

}  // namespace dspine::data
