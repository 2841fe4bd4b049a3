// The draft's side of speculative decoding (docs/decoding.md): a DSpine draft proposes one block
// per row from the target's hidden states of everything accepted so far. The block is anchored at
// the row's next position, whose token (the target's own last choice) fills slot 0; slots
// 1..T (T = block_size - 1) hold the mask token and give the T proposals, each from logits that
// see the context but not the other proposals (the backbone's parallel block).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "model/dspine_draft.h"

namespace dspine::decode {

// What the decoding loop asks of a draft (tests plug in drafts of known quality).
class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual int64_t proposals() const = 0;                      // T, tokens drafted per block
  virtual std::vector<int64_t> target_layer_ids() const = 0;  // the hidden states it reads
  // fp32 logits [B, T, V] of the proposals of row b's block at position anchors[b] (its token
  // anchor_tokens[b], [B] int64), from target_hidden [B, S, K·H] of which the row's first
  // anchors[b] positions are its context (the rest is not read). anchors[b] in [1, S].
  virtual at::Tensor logits(const at::Tensor& target_hidden, const std::vector<int64_t>& anchors,
                            const at::Tensor& anchor_tokens) = 0;
};

class BlockDrafter : public Drafter {
 public:
  // embed_tokens and lm_head: the target's frozen tables [V, H], on the draft's device.
  BlockDrafter(model::DSpineDraft draft, at::Tensor embed_tokens, at::Tensor lm_head);

  int64_t proposals() const override { return config().block_size - 1; }
  std::vector<int64_t> target_layer_ids() const override { return config().target_layer_ids; }
  at::Tensor logits(const at::Tensor& target_hidden, const std::vector<int64_t>& anchors,
                    const at::Tensor& anchor_tokens) override;
  const model::DSpineModelConfig& config() const { return draft_->config(); }

 private:
  model::DSpineDraft draft_;
  at::Tensor embed_tokens_, lm_head_;
  int64_t mask_token_id_;
};

}  // namespace dspine::decode
