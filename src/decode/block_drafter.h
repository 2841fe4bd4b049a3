// The draft's side of speculative decoding (docs/decoding.md): a draft proposes one block per row
// from the target's hidden states of everything accepted so far. The block is anchored at the
// row's next position, whose token (the target's own last choice) fills slot 0; slots 1..T
// (T = block_size - 1) hold the mask token and give the T proposals.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/row_spans.h"
#include "model/draft_decoding.h"
#include "model/dspine_draft.h"

namespace dspine::decode {

// A row's T drafted tokens and, when they were sampled, the distributions they were drawn from
// (the speculative-sampling rule needs them).
struct DraftedBlock {
  at::Tensor tokens;  // [B, T] int64
  at::Tensor probs;   // [B, T, V] fp32, rows summing to 1; undefined when drafted greedily
};

// How a draft picks its tokens: the argmax at temperature 0, else draws from the distribution at
// that temperature with `generator` (of the draft's device).
struct DraftDraws {
  double temperature = 0.0;
  at::Generator generator;
};

// Per-slot choices from per-slot logits [B, T, V] (of any floating dtype), independently.
DraftedBlock draw_from_logits(const at::Tensor& logits, const DraftDraws& draws);

// What the decoding loop asks of a draft (tests plug in drafts of known quality). A draft sees
// each context position once: start() opens a batch, extend() hands it the target's hidden states
// of new positions, propose() drafts at each row's next position. Positions come as
// core::RowSpans on the draft's device (a round builds them once for the draft and the target),
// with `keys`, the cached positions attention may read: on CUDA the decoder captures its rounds in
// a CUDA graph (docs/decoding.md, "CUDA graphs"), so extend() and propose() must not read the
// device back, and their shapes may depend on spans.keys but not on the positions' values.
class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual int64_t proposals() const = 0;                      // T, tokens drafted per block
  virtual std::vector<int64_t> target_layer_ids() const = 0;  // the hidden states it reads
  // A batch of `batch` rows of at most `capacity` positions each (blocks included). Returns true
  // when it kept the buffers of its previous start (same batch and capacity): a captured round
  // that holds their addresses stays valid, and what they hold is overwritten before it is read.
  virtual bool start(int64_t batch, int64_t capacity) = 0;
  // The target's hidden states [B, n, K·H] of row b's positions spans.positions[b] (n each).
  // Positions handed again (those of rejected drafts) replace what was there.
  virtual void extend(const at::Tensor& target_hidden, const core::RowSpans& spans) = 0;
  // Row b's block at positions block.positions[b] (T + 1 of them: the anchor, then the slots),
  // from the row's positions before the anchor; anchor_tokens [B] int64, the anchors' tokens.
  virtual DraftedBlock propose(const core::RowSpans& block, const at::Tensor& anchor_tokens,
                               const DraftDraws& draws) = 0;
};

// How a DSpine draft fills its block: every slot from the backbone's own logits (the parallel
// block), or the refinement walk, slot after slot through the refinement head over the backbone's
// model.dspine.top_k candidates with the token drafted before it as its predecessor.
enum class DraftWalk { kBackbone, kRefinement };

class BlockDrafter : public Drafter {
 public:
  // embed_tokens and lm_head: the target's frozen tables [V, H], on the draft's device.
  BlockDrafter(model::DSpineDraft draft, at::Tensor embed_tokens, at::Tensor lm_head,
               DraftWalk walk = DraftWalk::kBackbone);

  int64_t proposals() const override { return config().block_size - 1; }
  std::vector<int64_t> target_layer_ids() const override { return config().target_layer_ids; }
  bool start(int64_t batch, int64_t capacity) override;
  void extend(const at::Tensor& target_hidden, const core::RowSpans& spans) override;
  DraftedBlock propose(const core::RowSpans& block, const at::Tensor& anchor_tokens,
                       const DraftDraws& draws) override;
  const model::DSpineModelConfig& config() const { return draft_->config(); }

 private:
  DraftedBlock refinement_walk(const model::DraftOutput& out, const at::Tensor& logits,
                               const at::Tensor& anchor_tokens, const DraftDraws& draws);

  model::DSpineDraft draft_;
  at::Tensor embed_tokens_, lm_head_;
  int64_t mask_token_id_;
  DraftWalk walk_;
  std::unique_ptr<model::DraftDecodingCache> cache_;
  at::Tensor block_ids_;  // [B, bs]: the mask token, slot 0 overwritten by each round's anchors
};

}  // namespace dspine::decode
