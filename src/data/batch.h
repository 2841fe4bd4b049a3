// One micro-batch of draft-model training inputs: exactly what the target model provides.
#pragma once

#include <ATen/core/Tensor.h>

namespace dspine::data {

struct DraftBatch {
  at::Tensor input_ids;                  // [B, S] int64 token ids
  at::Tensor loss_mask;                  // [B, S] int64 0/1 (1 = supervised position)
  at::Tensor hidden_states;              // [B, S, K*H] target layers target_layer_ids, concatenated
  at::Tensor target_last_hidden_states;  // [B, S, H] the target's final (post-norm) hidden state
  // loss_mask's host copy, kept by to() when the mask moves to a device: the anchor sampler sizes
  // the blocks from it without reading the GPU (docs/model.md, "The host stays ahead"). Code that
  // changes loss_mask afterwards resets it.
  at::Tensor host_loss_mask{};

  int64_t rows() const { return input_ids.size(0); }
  // The loss mask on the host: the kept copy, the mask itself, or (a GPU read) a copy of it.
  at::Tensor loss_mask_on_host() const;
  // Every field on `device`; a mask moved off the host keeps its host copy.
  DraftBatch to(const at::Device& device) const;
  // Rows [begin, end) of every field.
  DraftBatch slice_rows(int64_t begin, int64_t end) const;
};

// `host` on `device`, queued without the host waiting for the GPU: copied through pinned memory,
// which the caching host allocator keeps until the copy has run. A CPU `device` gets `host` itself.
at::Tensor queue_copy_to(const at::Tensor& host, const at::Device& device);

// Row-wise concatenation (used by tests comparing windows with one combined batch).
DraftBatch concat_rows(const std::vector<DraftBatch>& batches);

}  // namespace dspine::data
