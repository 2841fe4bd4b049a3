#include "decode/block_drafter.h"

#include <torch/torch.h>

#include <algorithm>

#include "core/error.h"
#include "decode/verification.h"

namespace dspine::decode {

DraftedBlock draw_from_logits(const at::Tensor& logits, const DraftDraws& draws) {
  // In the logits' own dtype: widening to fp32 is exact, so the argmax is the same.
  if (draws.temperature == 0.0) return {logits.argmax(-1), at::Tensor()};
  const int64_t rows = logits.size(0), slots = logits.size(1), vocab = logits.size(2);
  auto probs = torch::softmax(logits.to(torch::kFloat32) / draws.temperature, -1);
  auto tokens = sample_rows(probs.view({rows * slots, vocab}), draws.generator);
  return {tokens.view({rows, slots}), probs};
}

BlockDrafter::BlockDrafter(model::DSpineDraft draft, at::Tensor embed_tokens, at::Tensor lm_head,
                           DraftWalk walk)
    : draft_(std::move(draft)),
      embed_tokens_(std::move(embed_tokens)),
      lm_head_(std::move(lm_head)),
      mask_token_id_(model::resolved_mask_token_id(draft_->config())),
      walk_(walk) {
  const auto& c = draft_->config();
  if (lm_head_.dim() != 2 || lm_head_.size(0) != c.vocab_size ||
      lm_head_.size(1) != c.hidden_size || embed_tokens_.sizes() != lm_head_.sizes()) {
    fail(
        "decoding: the target's embedding [{}] and head [{}] do not fit the draft (vocabulary {}, "
        "hidden size {})",
        c10::str(embed_tokens_.sizes()), c10::str(lm_head_.sizes()), c.vocab_size, c.hidden_size);
  }
}

bool BlockDrafter::start(int64_t batch, int64_t capacity) {
  if (cache_ && cache_->batch() == batch && cache_->capacity() == capacity) {
    cache_->refresh_weights();  // the draft may have trained since
    return true;
  }
  cache_.reset();  // its memory first
  cache_ = std::make_unique<model::DraftDecodingCache>(*draft_, batch, capacity);
  block_ids_ = torch::full({batch, config().block_size}, mask_token_id_,
                           torch::TensorOptions().dtype(torch::kInt64).device(lm_head_.device()));
  return false;
}

void BlockDrafter::extend(const at::Tensor& target_hidden, const core::RowSpans& spans) {
  if (!cache_) fail("decoding: the draft was handed context before start()");
  cache_->extend(target_hidden, spans);
}

DraftedBlock BlockDrafter::propose(const core::RowSpans& block, const at::Tensor& anchor_tokens,
                                   const DraftDraws& draws) {
  torch::NoGradGuard no_grad;
  if (!cache_) fail("decoding: the draft was asked for a block before start()");
  const int64_t rows = block.positions.size(0), bs = config().block_size;
  if (anchor_tokens.numel() != rows || rows != block_ids_.size(0) ||
      block.positions.size(1) != bs) {
    fail("decoding: {} anchor tokens and block positions [{}] for {} rows of block size {}",
         anchor_tokens.numel(), c10::str(block.positions.sizes()), block_ids_.size(0), bs);
  }
  // Slot 0: the anchor's token; the proposals' slots keep the mask token.
  block_ids_.select(1, 0).copy_(anchor_tokens.view({rows}));
  const auto out = cache_->block(block, block_ids_, torch::embedding(embed_tokens_, block_ids_),
                                 /*keep_pre_injection=*/walk_ == DraftWalk::kRefinement);
  // Every slot's logits in one GEMM over the contiguous states; the proposals are slots 1..T.
  const int64_t hidden = config().hidden_size;
  const auto logits =
      torch::nn::functional::linear(out.hidden_states.view({rows * bs, hidden}), lm_head_)
          .view({rows, bs, -1})
          .narrow(1, 1, bs - 1);
  if (walk_ == DraftWalk::kBackbone) return draw_from_logits(logits, draws);
  return refinement_walk(out, logits, anchor_tokens.view({rows}).to(lm_head_.device()), draws);
}

DraftedBlock BlockDrafter::refinement_walk(const model::DraftOutput& out, const at::Tensor& logits,
                                           const at::Tensor& anchor_tokens,
                                           const DraftDraws& draws) {
  const int64_t rows = logits.size(0), slots = logits.size(1), vocab = logits.size(2);
  const int64_t k = std::min<int64_t>(config().dspine.top_k, vocab);
  const auto candidates = std::get<1>(logits.topk(k, -1));      // [B, T, k]
  const auto pre = out.pre_injection.select(1, 0).slice(1, 1);  // [B, T, H]
  std::vector<at::Tensor> tokens, probs;
  auto previous = anchor_tokens;
  for (int64_t slot = 0; slot < slots; ++slot) {
    const auto refined = draft_->refine(pre.select(1, slot), previous);  // [B, H]
    const auto slot_candidates = candidates.select(1, slot);             // [B, k]
    const auto heads = lm_head_.index_select(0, slot_candidates.reshape(-1)).view({rows, k, -1});
    const auto scores = torch::bmm(heads, refined.unsqueeze(2)).squeeze(2).to(torch::kFloat32);
    at::Tensor choice;
    if (draws.temperature == 0.0) {
      choice = scores.argmax(1);
    } else {
      const auto p = torch::softmax(scores / draws.temperature, -1);  // [B, k]
      choice = sample_rows(p, draws.generator);
      probs.push_back(torch::zeros({rows, vocab}, p.options()).scatter_(1, slot_candidates, p));
    }
    previous = slot_candidates.gather(1, choice.view({rows, 1})).view({rows});
    tokens.push_back(previous);
  }
  return {torch::stack(tokens, 1), probs.empty() ? at::Tensor() : torch::stack(probs, 1)};
}

}  // namespace dspine::decode
