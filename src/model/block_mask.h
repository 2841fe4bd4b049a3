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

// The mask as the attention layers consume it, prepared once per forward, in one of two forms.
// Dense (the reference path): `keys` is the boolean mask; fully masked query rows (dropped blocks)
// must produce zeros (docs/model.md, "The block attention mask"), so they are let see every key,
// which keeps every SDPA backend free of NaN, and their output is multiplied by `rows_visible` = 0,
// which also stops their gradient. Blocks (the fused kernels): only anchors, keep and the block
// size; the kernels derive the pattern and skip the tiles nobody sees.
struct AttentionMask {
  at::Tensor keys;          // [B, 1, Q, S+Q] bool (dense form)
  at::Tensor rows_visible;  // [B, 1, Q, 1] bool: the query row sees at least one key (dense form)
  at::Tensor anchors;       // [B, N] int64 (blocks form)
  at::Tensor keep;          // [B, N] bool (blocks form)
  int64_t block_size = 0;   // (blocks form)
  bool dense() const { return keys.defined(); }
};
AttentionMask prepare_attention_mask(const at::Tensor& mask);
AttentionMask block_form_attention_mask(const at::Tensor& anchors, const at::Tensor& keep,
                                        int64_t block_size);

}  // namespace dspine::model
