// Where training batches come from: the live synthetic target, safetensors shards or seeded
// random values (benchmarks). All are deterministic functions of a sample cursor, so resume
// restores the cursor only.
#pragma once

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "core/config.h"
#include "data/batch.h"

namespace dspine::data {

class Qwen3Model;

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // The next `rows` samples as one batch (hidden states fp32 on the CPU, except the random and
  // target sources', which live on the training device, the target's in its dtype); advances the
  // cursor.
  virtual DraftBatch next(int64_t rows) = 0;
  // Index of the next sample to be read; samples are numbered from 0 across epochs.
  virtual int64_t cursor() const = 0;
  virtual void seek(int64_t cursor) = 0;
  // The target's frozen weights the draft shares: [V, H] each (fp32, or the target source's own
  // tensors in its dtype on its device).
  virtual at::Tensor embed_tokens() const = 0;
  virtual at::Tensor lm_head() const = 0;
  // The target model running online behind the batches, if any (it verifies drafted blocks in the
  // acceptance evaluation); null for sources that read stored or synthetic data.
  virtual const Qwen3Model* online_target() const { return nullptr; }
};

// Builds the source selected by config.data.source (errors name the shard directory/file).
// `device` is the training device: the random and target sources compute there; the others
// ignore it.
std::unique_ptr<BatchSource> make_batch_source(const core::Config& config,
                                               const c10::Device& device);

}  // namespace dspine::data
