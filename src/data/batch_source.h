// Where training batches come from: the live synthetic target, safetensors shards or seeded
// random values (benchmarks). All are deterministic functions of a sample cursor, so resume
// restores the cursor only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "core/config.h"
#include "data/batch.h"

namespace dspine::target {
class Qwen3Model;
}  // namespace dspine::target

namespace dspine::data {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // The next `rows` samples as one batch (hidden states fp32 on the CPU, except the random and
  // target sources', which live on the training device, the target's in its dtype); advances the
  // cursor.
  virtual DraftBatch next(int64_t rows) = 0;
  // Starts computing the batch that next(rows) at `cursor` will return, where the source can do
  // that work ahead (the online target, on its own CUDA stream while the caller trains); a later
  // next() at that cursor and row count takes it. Default: nothing.
  virtual void prefetch(int64_t /*cursor*/, int64_t /*rows*/) {}
  // Index of the next sample to be read; samples are numbered from 0 across epochs.
  virtual int64_t cursor() const = 0;
  virtual void seek(int64_t cursor) = 0;
  // The target's frozen weights the draft shares: [V, H] each (fp32, or the target source's own
  // tensors in its dtype on its device).
  virtual at::Tensor embed_tokens() const = 0;
  virtual at::Tensor lm_head() const = 0;
  // The target model running online behind the batches, if any (it verifies drafted blocks in the
  // acceptance evaluation); null for sources that read stored or synthetic data.
  virtual const target::Qwen3Model* online_target() const { return nullptr; }
  // Distinct samples before the cursor wraps around (a finite file or directory); 0 for sources
  // that compute every sample (synthetic, random, a target on random tokens).
  virtual int64_t distinct_samples() const { return 0; }
  // What the samples are read from, for messages ("data.samples tokens.jsonl").
  virtual std::string describe() const = 0;
};

// Builds the source selected by config.data.source (errors name the shard directory/file).
// `device` is the training device: the random and target sources compute there; the others
// ignore it.
std::unique_ptr<BatchSource> make_batch_source(const core::Config& config,
                                               const c10::Device& device);

// The separate held-out source of data.eval_samples_file / eval_shards_dir / eval_specforge_dir,
// sharing `training`'s target and frozen tables; null when none is set (the evaluation then reads
// the training source itself). docs/evaluation.md, "Held-out rows".
std::unique_ptr<BatchSource> make_held_out_source(const core::Config& config,
                                                  BatchSource& training);

}  // namespace dspine::data
