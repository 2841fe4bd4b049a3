// A DSpine draft in a decoding loop (docs/decoding.md, "The draft's cache"). Training runs the
// draft over the whole context at every step; decoding would repeat that work at every round. But
// a context position enters the draft only as keys and values of each layer, computed from the
// target's hidden states at that position alone (hidden_norm(fc(·)), then each layer's k/v
// projection, key norm and RoPE), so they are cached once per position. A round then runs only the
// block: its queries attend to the cached context before the anchor and, causally, to the block,
// exactly the pattern of the training mask (model/block_mask.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "core/row_spans.h"
#include "model/dspine_draft.h"

namespace dspine::model {

// It runs on whole weights: the units a forward announces to the draft's observer (sharded
// gathers) are not announced here, so a caller that shards the draft gathers it first.
class DraftDecodingCache {
 public:
  // Room for `batch` rows of `capacity` positions each, in the draft's dtype and on its device.
  DraftDecodingCache(DSpineDraftImpl& draft, int64_t batch, int64_t capacity);
  int64_t batch() const { return keys_[0].size(0); }
  int64_t capacity() const { return keys_[0].size(2); }

  // Caches row b's context positions starts[b] .. starts[b] + n - 1 from the target's hidden
  // states target_hidden [B, n, K·H] there. Positions written again replace what was there.
  void extend(const at::Tensor& target_hidden, const std::vector<int64_t>& starts);
  // The same with starts [B] int64 on the draft's device; nothing is read back from the device
  // (a CUDA graph can capture it). `keys` (at least every start + n) only bounds the check.
  void extend(const at::Tensor& target_hidden, const at::Tensor& starts, int64_t keys);

  // Row b's block at position anchors[b], seeing its first anchors[b] cached positions:
  // block_ids [B, bs] (slot 0 the anchor's token, the rest the mask token) and their embeddings
  // noise [B, bs, H]. Returns hidden_states and pre_injection [B, 1, bs, H] (as forward). The
  // block's own keys and values go into the cache at the anchor's positions, where extend() later
  // writes the context's.
  DraftOutput block(const std::vector<int64_t>& anchors, const at::Tensor& block_ids,
                    const at::Tensor& noise);
  // The same with anchors [B] int64 on the draft's device, attention over the first `keys` cached
  // positions (at least every anchor + bs): nothing is read back from the device, and a fixed
  // `keys` gives fixed shapes (docs/decoding.md, "CUDA graphs").
  DraftOutput block(const at::Tensor& anchors, int64_t keys, const at::Tensor& block_ids,
                    const at::Tensor& noise);

 private:
  void write_context(const at::Tensor& target_hidden, const core::RowSpans& spans);
  DraftOutput run_block(const core::RowSpans& spans, const at::Tensor& block_ids,
                        const at::Tensor& noise);

  DSpineDraftImpl& draft_;
  at::Tensor inv_freq_;
  std::vector<at::Tensor> keys_, values_;  // per layer [B, kv heads, capacity, head_dim]
};

}  // namespace dspine::model
