#include "data/random_source.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <torch/torch.h>

#include "core/error.h"
#include "core/seeding.h"

namespace dspine::data {
namespace {

// Weight streams use indices no sample cursor reaches (cursors are >= 0).
constexpr int64_t kEmbedStream = -1;
constexpr int64_t kHeadStream = -2;

// A fresh generator on `device`: the global default generators (and so the trainer's RNG
// streams) are never touched.
at::Generator generator_on(const c10::Device& device, uint64_t seed) {
  at::Generator gen = device.is_cuda() ? at::cuda::detail::createCUDAGenerator(device.index())
                                       : at::make_generator<at::CPUGeneratorImpl>();
  gen.set_current_seed(core::generator_seed(seed));
  return gen;
}

}  // namespace

RandomSource::RandomSource(const core::DataConfig& data, const core::ModelConfig& draft,
                           const c10::Device& device)
    : device_(device),
      seed_(data.synthetic.seed),
      seq_len_(data.seq_len),
      prompt_length_(data.synthetic.prompt_length),
      vocab_(draft.vocab_size),
      hidden_(draft.hidden_size),
      features_(static_cast<int64_t>(draft.target_layer_ids.size()) * hidden_),
      mask_id_(draft.mask_token_id < 0 ? vocab_ - 1 : draft.mask_token_id) {
  if (vocab_ < 2) fail("random source: model.vocab_size must be >= 2 (got {})", vocab_);
}

DraftBatch RandomSource::next(int64_t rows) {
  if (rows < 1) fail("random source: rows must be >= 1 (got {})", rows);
  at::NoGradGuard no_grad;
  const auto floats = at::TensorOptions().dtype(at::kFloat).device(device_);
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device_);
  // The mask is made on the host and kept there too, so the anchors need no read of the GPU.
  auto mask = at::ones({rows, seq_len_}, at::kLong);
  mask.narrow(1, 0, prompt_length_).zero_();
  DraftBatch batch{at::empty({rows, seq_len_}, longs), queue_copy_to(mask, device_),
                   at::empty({rows, seq_len_, features_}, floats),
                   at::empty({rows, seq_len_, hidden_}, floats)};
  if (!device_.is_cpu()) batch.host_loss_mask = mask;
  // One generator per sample, drawn in a fixed order, so a row's values do not depend on which
  // batch it was fetched in.
  for (int64_t r = 0; r < rows; ++r) {
    at::Generator gen = generator_on(device_, core::stream_seed(seed_, cursor_ + r));
    batch.input_ids.select(0, r).random_(0, vocab_ - 1, gen);
    batch.hidden_states.select(0, r).normal_(0.0, 1.0, gen);
    batch.target_last_hidden_states.select(0, r).normal_(0.0, 1.0, gen);
  }
  // Ids at or above the mask token move up one: uniform over the vocabulary without it.
  batch.input_ids.add_(batch.input_ids.ge(mask_id_).to(at::kLong));
  cursor_ += rows;
  return batch;
}

void RandomSource::seek(int64_t cursor) {
  if (cursor < 0) fail("random source: cursor must be >= 0 (got {})", cursor);
  cursor_ = cursor;
}

at::Tensor RandomSource::weight(int64_t stream) const {
  at::NoGradGuard no_grad;
  at::Generator gen = generator_on(device_, core::stream_seed(seed_, stream));
  return at::empty({vocab_, hidden_}, at::TensorOptions().dtype(at::kFloat).device(device_))
      .normal_(0.0, kWeightStd, gen);
}

at::Tensor RandomSource::embed_tokens() const { return weight(kEmbedStream); }
at::Tensor RandomSource::lm_head() const { return weight(kHeadStream); }

}  // namespace dspine::data
