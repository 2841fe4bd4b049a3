// The DSpine block attention mask (docs/model.md, "The block attention mask"; full-attention
// layers).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dspine::model {

// Dense boolean mask [B, 1, Q, S+Q] (true = visible), Q = N*block_size, for anchors/keep [B, N].
// Query q = n*bs + j of block n (anchor a): context key k < S is visible iff k < a (strictly
// before the anchor); draft key S + k' is visible iff k' / bs == n and k' % bs <= j (causal inside
// the block); a block with keep = false sees nothing.
at::Tensor block_attention_mask(const at::Tensor& anchors, const at::Tensor& keep, int64_t seq_len,
                                int64_t block_size);

// The mask as the attention layers consume it, prepared once per forward. Fully masked query rows
// (dropped blocks) must produce zeros (docs/model.md, "The block attention mask"): they are let see
// every key so that no backend produces NaN, and their output is multiplied by `rows_visible` = 0,
// which also stops their gradient.
struct AttentionMask {
  at::Tensor keys;          // [B, 1, Q, S+Q] bool
  at::Tensor rows_visible;  // [B, 1, Q, 1] bool: the query row sees at least one key
};
AttentionMask prepare_attention_mask(const at::Tensor& mask);

}  // namespace dspine::model
