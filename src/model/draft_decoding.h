// A DSpine draft in a decoding loop (docs/decoding.md, "The draft's cache"). Training runs the
// draft over the whole context at every step; decoding would repeat that work at every round. But
// a context position enters the draft only as keys and values of each layer, computed from the
// target's hidden states at that position alone (hidden_norm(fc(·)), then each layer's k/v
// projection, key norm and RoPE), so they are cached once per position. A round then runs only the
// block: its queries attend to the cached context before the anchor and, causally, to the block,
// exactly the pattern of the training mask (model/block_mask.h).
//
// A round at batch 1 is a chain of small kernels, so the cache runs the draft's layers through a
// decoding path of its own with fewer of them (docs/decoding.md, "Kernels per round"): q/k/v,
// gate/up and every layer's context k/v as one GEMM each on packed copies of the weights, the MLP's
// residual added by the down projection's GEMM, RoPE gathered from tables of every cache position
// (once per round: the block and the context that follows it share positions), and the injection
// as one GEMM that reads the state, one kernel that makes the gated messages and one GEMM that
// adds their write into the state (ops/injection_gate_ops.h). The same function as
// DSpineDraftImpl::forward, up to rounding.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "core/row_spans.h"
#include "model/dspine_draft.h"
#include "model/rope.h"

namespace dspine::model {

// It runs on whole weights: the units a forward announces to the draft's observer (sharded
// gathers) are not announced here, so a caller that shards the draft gathers it first.
class DraftDecodingCache {
 public:
  // Room for `batch` rows of `capacity` positions each, in the draft's dtype and on its device.
  DraftDecodingCache(DSpineDraftImpl& draft, int64_t batch, int64_t capacity);
  int64_t batch() const { return keys_[0].size(0); }
  int64_t capacity() const { return keys_[0].size(2); }

  // Copies the draft's weights into the packed ones (in place: a captured round keeps reading
  // them). The constructor does it once; call it again after the draft's weights change.
  void refresh_weights();

  // Caches row b's context positions starts[b] .. starts[b] + n - 1 from the target's hidden
  // states target_hidden [B, n, K·H] there. Positions written again replace what was there.
  void extend(const at::Tensor& target_hidden, const std::vector<int64_t>& starts);
  // The same at `spans` (core::row_spans of n positions per row, on the draft's device). Nothing
  // is read back from the device (a CUDA graph can capture it).
  void extend(const at::Tensor& target_hidden, const core::RowSpans& spans);

  // Row b's block at position anchors[b], seeing its first anchors[b] cached positions:
  // block_ids [B, bs] (slot 0 the anchor's token, the rest the mask token) and their embeddings
  // noise [B, bs, H]. Returns hidden_states and pre_injection [B, 1, bs, H] (as forward). The
  // block's own keys and values go into the cache at the anchor's positions, where extend() later
  // writes the context's.
  DraftOutput block(const std::vector<int64_t>& anchors, const at::Tensor& block_ids,
                    const at::Tensor& noise);
  // The same at `spans` (core::row_spans of the anchors, bs positions per row, its bias in the
  // draft's dtype), attention over the first spans.keys cached positions: nothing is read back
  // from the device, and fixed spans.keys give fixed shapes (docs/decoding.md, "CUDA graphs").
  // Without `keep_pre_injection` the last layer's injection writes into its state in place and
  // pre_injection is undefined (the backbone walk does not read it).
  DraftOutput block(const core::RowSpans& spans, const at::Tensor& block_ids,
                    const at::Tensor& noise, bool keep_pre_injection = true);

 private:
  at::Tensor layer(size_t index, const at::Tensor& x, const core::RowSpans& spans,
                   const RopeTables& rope, const at::Tensor& bias);
  // Writes layer `index`'s injection into h [B, bs, H] in place; anchor_ids [B].
  void inject(size_t index, const at::Tensor& h, const at::Tensor& anchor_ids);
  // RoPE's rows at the spans' positions, gathered once for a block and the context after it.
  const RopeTables& rope_at(const core::RowSpans& spans);

  DSpineDraftImpl& draft_;
  std::vector<at::Tensor> keys_, values_;  // per layer [B, kv heads, capacity, head_dim]
  at::Tensor rope_cos_, rope_sin_;         // [capacity, head_dim]: RoPE of every cache position
  at::Tensor rope_positions_;              // the positions rope_ holds the rows of
  RopeTables rope_;
  // Packed copies of the weights: per layer [q; k; v], [gate; up] and the injection's input
  // [readout; receiver_gate·readout; predecessor_gate·readout; message·readout]; every layer's
  // [k; v] in layer order; [predecessor_gate; message] applied to every token's scaled transfer
  // code [V, 2m].
  std::vector<at::Tensor> qkv_, gate_up_, injection_in_;
  at::Tensor context_kv_, anchor_terms_;
};

}  // namespace dspine::model
