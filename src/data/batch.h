// One micro-batch of draft-model training inputs: exactly what the target model provides.
#pragma once

#include <ATen/core/Tensor.h>

namespace dspine::data {

struct DraftBatch {
  at::Tensor input_ids;                  // [B, S] int64 token ids
  at::Tensor loss_mask;                  // [B, S] int64 0/1 (1 = supervised position)
  at::Tensor hidden_states;              // [B, S, K*H] target layers target_layer_ids, concatenated
  at::Tensor target_last_hidden_states;  // [B, S, H] the target's final (post-norm) hidden state

  int64_t rows() const { return input_ids.size(0); }
  DraftBatch to(const at::Device& device) const;
  // Rows [begin, end) of every field.
  DraftBatch slice_rows(int64_t begin, int64_t end) const;
};

// Row-wise concatenation (used by tests comparing windows with one combined batch).
DraftBatch concat_rows(const std::vector<DraftBatch>& batches);

}  // namespace dspine::data
