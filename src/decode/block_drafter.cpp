#include "decode/block_drafter.h"

#include <torch/torch.h>

#include "core/error.h"
#include "objectives/dspine_blocks.h"

namespace dspine::decode {

BlockDrafter::BlockDrafter(model::DSpineDraft draft, at::Tensor embed_tokens, at::Tensor lm_head)
    : draft_(std::move(draft)),
      embed_tokens_(std::move(embed_tokens)),
      lm_head_(std::move(lm_head)),
      mask_token_id_(model::resolved_mask_token_id(draft_->config())) {
  const auto& c = draft_->config();
  if (lm_head_.dim() != 2 || lm_head_.size(0) != c.vocab_size ||
      lm_head_.size(1) != c.hidden_size || embed_tokens_.sizes() != lm_head_.sizes()) {
    fail(
        "decoding: the target's embedding [{}] and head [{}] do not fit the draft (vocabulary {}, "
        "hidden size {})",
        c10::str(embed_tokens_.sizes()), c10::str(lm_head_.sizes()), c.vocab_size, c.hidden_size);
  }
}

at::Tensor BlockDrafter::logits(const at::Tensor& target_hidden,
                                const std::vector<int64_t>& anchors,
                                const at::Tensor& anchor_tokens) {
  torch::NoGradGuard no_grad;
  const int64_t rows = target_hidden.size(0), context = target_hidden.size(1);
  const int64_t bs = config().block_size;
  if (static_cast<int64_t>(anchors.size()) != rows || anchor_tokens.numel() != rows) {
    fail("decoding: {} anchors and {} anchor tokens for {} rows", anchors.size(),
         anchor_tokens.numel(), rows);
  }
  for (int64_t a : anchors) {
    if (a < 1 || a > context) fail("decoding: anchor {} outside [1, {}]", a, context);
  }
  const auto device = lm_head_.device();
  const auto anchor_positions = torch::tensor(anchors, torch::kInt64).view({rows, 1}).to(device);
  const auto keep =
      torch::ones({rows, 1}, torch::TensorOptions().dtype(torch::kBool).device(device));
  // Slot 0: the anchor's token; the proposals' slots: the mask token.
  auto block_ids = torch::full({rows, 1, bs}, mask_token_id_,
                               torch::TensorOptions().dtype(torch::kInt64).device(device));
  block_ids.select(2, 0).copy_(anchor_tokens.view({rows, 1}));
  const auto noise = torch::embedding(embed_tokens_, block_ids.view({rows, bs}));
  const auto positions = objectives::block_position_ids(anchor_positions, context, bs);
  const auto out = draft_->forward(positions, anchor_positions, keep, noise,
                                   target_hidden.to(device, lm_head_.scalar_type()), block_ids,
                                   at::Tensor(), /*layer_features=*/false);
  const auto hidden = out.hidden_states.select(1, 0).slice(1, 1);  // [B, T, H]
  return torch::matmul(hidden, lm_head_.t()).to(torch::kFloat32);
}

}  // namespace dspine::decode
