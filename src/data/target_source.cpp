#include "data/target_source.h"

#include <algorithm>
#include <filesystem>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "core/error.h"
#include "core/seeding.h"

namespace dspine::data {
namespace fs = std::filesystem;

namespace {

// Batches computed ahead and not yet read: one window's micro-batches, with room for a window
// that an evaluation or a rejected update left unread.
constexpr size_t kMaxPrefetched = 16;

}  // namespace

at::ScalarType target_dtype(core::Dtype training_dtype, const c10::Device& device) {
  return device.is_cuda() && training_dtype == core::Dtype::kBf16 ? at::kBFloat16 : at::kFloat;
}

target::Qwen3Model load_target(const core::TargetModelConfig& target,
                               const core::ModelConfig& draft, at::ScalarType dtype,
                               const c10::Device& device) {
  const std::string& dir = target.path;
  const std::string config_json = (fs::path(dir) / "config.json").string();
  target::Qwen3Model model =
      target.random ? target::Qwen3Model::random(target::read_qwen3_config(config_json),
                                                 static_cast<uint64_t>(target.seed), dtype, device)
                    : target::Qwen3Model::load_hf(dir, dtype, device);
  // model.fused_kernels=false keeps the target on HF's ATen composition as well as the draft.
  if (draft.fused_kernels == core::FusedKernels::kOff) model.use_fused_kernels(false);
  const target::Qwen3Dims& dims = model.dims();
  const auto mismatch = [&](const char* what, int64_t have, const char* key, int64_t want) {
    fail("{}: the target has {} {}, but the config has {} = {}", config_json, what, have, key, want);
  };
  if (dims.hidden_size != draft.hidden_size) {
    mismatch("hidden_size", dims.hidden_size, "model.hidden_size", draft.hidden_size);
  }
  if (dims.vocab_size != draft.vocab_size) {
    mismatch("vocab_size", dims.vocab_size, "model.vocab_size", draft.vocab_size);
  }
  for (int64_t id : draft.target_layer_ids) {
    if (id >= dims.num_hidden_layers) {
      fail(
          "{}: model.target_layer_ids [{}] must be layers of the target, in [0, "
          "num_hidden_layers = {})",
          config_json, fmt::join(draft.target_layer_ids, ", "), dims.num_hidden_layers);
    }
  }
  return model;
}

TargetSource::TargetSource(const core::DataConfig& data, const core::ModelConfig& draft,
                           at::ScalarType dtype, const c10::Device& device)
    : device_(device),
      model_(load_target(data.target, draft, dtype, device)),
      layer_ids_(draft.target_layer_ids),
      seq_len_(data.seq_len),
      seed_(data.target.seed),
      prompt_length_(data.synthetic.prompt_length),
      vocab_(draft.vocab_size),
      mask_id_(draft.mask_token_id < 0 ? vocab_ - 1 : draft.mask_token_id),
      prefetch_(data.target.prefetch) {
  if (!data.samples.empty()) samples_.emplace(data.samples, vocab_, "data.samples");
}

TargetSource::TargetSource(const TargetSource& training, const std::string& samples_path)
    : device_(training.device_),
      model_(training.model_),
      layer_ids_(training.layer_ids_),
      seq_len_(training.seq_len_),
      seed_(training.seed_),
      prompt_length_(training.prompt_length_),
      vocab_(training.vocab_),
      mask_id_(training.mask_id_),
      prefetch_(false) {  // held-out rows are read once, by the evaluation
  samples_.emplace(samples_path, vocab_, "data.eval_samples_file");
}

std::string TargetSource::describe() const {
  return samples_ ? "token samples " + samples_->path()
                  : fmt::format("random tokens (seed {})", seed_);
}

DraftBatch TargetSource::random_tokens(int64_t cursor, int64_t rows) const {
  DraftBatch batch{at::empty({rows, seq_len_}, at::kLong), at::ones({rows, seq_len_}, at::kLong),
                   {}, {}};
  batch.loss_mask.narrow(1, 0, prompt_length_).zero_();
  for (int64_t r = 0; r < rows; ++r) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>();
    gen.set_current_seed(core::generator_seed(core::stream_seed(seed_, cursor + r)));
    batch.input_ids.select(0, r).random_(0, vocab_ - 1, gen);
  }
  // Ids at or above the mask token move up one: uniform over the vocabulary without it.
  batch.input_ids.add_(batch.input_ids.ge(mask_id_).to(at::kLong));
  return batch;
}

DraftBatch TargetSource::compute(int64_t cursor, int64_t rows) {
  at::NoGradGuard no_grad;
  DraftBatch batch = samples_ ? DraftBatch{} : random_tokens(cursor, rows);
  if (samples_) std::tie(batch.input_ids, batch.loss_mask) = samples_->rows(cursor, rows, seq_len_);
  batch = batch.to(device_);
  target::Qwen3Model::Outputs out = model_.forward(batch.input_ids, layer_ids_);
  batch.hidden_states = std::move(out.hidden_states);
  batch.target_last_hidden_states = std::move(out.last_hidden_state);
  return batch;
}

std::vector<TargetSource::Prefetched>::iterator TargetSource::computed_ahead(int64_t cursor,
                                                                             int64_t rows) {
  return std::find_if(prefetched_.begin(), prefetched_.end(),
                      [&](const Prefetched& p) { return p.cursor == cursor && p.rows == rows; });
}

DraftBatch TargetSource::next(int64_t rows) {
  if (rows < 1) fail("target source: rows must be >= 1 (got {})", rows);
  const auto ahead = computed_ahead(cursor_, rows);
  DraftBatch batch;
  if (ahead == prefetched_.end()) {
    batch = compute(cursor_, rows);
  } else {
    batch = std::move(ahead->batch);
    if (ahead->ready) {
      // The caller's stream waits for the side stream's forward, and the batch's memory is not
      // reused before the caller's work with it is done.
      const c10::impl::VirtualGuardImpl guard(device_.type());
      const c10::Stream current = guard.getStream(side_stream_->device());
      ahead->ready->block(current);
      for (const at::Tensor* t : {&batch.input_ids, &batch.loss_mask, &batch.hidden_states,
                                  &batch.target_last_hidden_states}) {
        if (t->defined()) t->record_stream(current);
      }
    }
    prefetched_.erase(ahead);
  }
  cursor_ += rows;
  return batch;
}

void TargetSource::prefetch(int64_t cursor, int64_t rows) {
  if (!prefetch_ || cursor < 0 || rows < 1 || computed_ahead(cursor, rows) != prefetched_.end()) {
    return;
  }
  if (prefetched_.size() == kMaxPrefetched) prefetched_.erase(prefetched_.begin());
  Prefetched ahead{cursor, rows, {}, {}};
  try {
    if (!device_.is_cuda()) {
      ahead.batch = compute(cursor, rows);
    } else {
      const c10::impl::VirtualGuardImpl guard(device_.type());
      const c10::Device device(device_.type(),
                               device_.has_index() ? device_.index() : guard.getDevice().index());
      if (!side_stream_) side_stream_ = guard.getStreamFromGlobalPool(device);
      // After the work queued so far on the caller's stream (what made the weights, at first).
      c10::Event queued(device_.type());
      queued.record(guard.getStream(device));
      queued.block(*side_stream_);
      const c10::StreamGuard on_side(*side_stream_);
      ahead.batch = compute(cursor, rows);
      ahead.ready.emplace(device_.type());
      ahead.ready->record(*side_stream_);
    }
  } catch (const Error&) {
    return;  // next() at this cursor computes the batch again and reports what is wrong
  }
  prefetched_.push_back(std::move(ahead));
}

void TargetSource::seek(int64_t cursor) {
  if (cursor < 0) fail("target source: cursor must be >= 0 (got {})", cursor);
  cursor_ = cursor;
}

}  // namespace dspine::data
