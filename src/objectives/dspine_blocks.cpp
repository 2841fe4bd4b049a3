#include "objectives/dspine_blocks.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dspine::objectives {

torch::Tensor valid_anchor_positions(const torch::Tensor& loss_mask) {
  auto supervised = loss_mask > 0.5;
  return supervised.slice(1, 0, -1) & supervised.slice(1, 1);  // [B, S-1]
}

int64_t max_valid_anchors(const at::Tensor& loss_mask) {
  auto counts = valid_anchor_positions(loss_mask.cpu()).sum(1);
  return counts.numel() == 0 ? 0 : counts.max().item<int64_t>();
}

AnchorSample sample_anchors(const at::Tensor& loss_mask, int64_t num_anchors,
                            const RowStreams& streams) {
  const auto host_mask = loss_mask.cpu();
  const int64_t rows = host_mask.size(0), seq_len = host_mask.size(1);
  const int64_t width = std::min(num_anchors, std::max<int64_t>(0, max_valid_anchors(host_mask)));
  if (width <= 0) {
    fail("DFlash-family training requires two consecutive supervised tokens (loss_mask {})",
         c10::str(host_mask.sizes()));
  }
  auto valid = valid_anchor_positions(host_mask);
  auto counts = valid.sum(1, /*keepdim=*/true);
  auto u = streams.uniform(RowDraw::kAnchors, rows, seq_len - 1);
  u.masked_fill_(valid.logical_not(), 2.0);
  auto candidates =
      std::get<1>(u.sort(std::optional<bool>(true), 1, /*descending=*/false)).slice(1, 0, width);
  auto slot = torch::arange(width, candidates.options()).unsqueeze(0);
  auto kept = slot < counts.clamp_max(width);
  auto anchors = std::get<0>(torch::where(kept, candidates, seq_len - 1).sort(1));
  auto keep = anchors < seq_len - 1;
  return {torch::where(keep, anchors, 0), keep};
}

at::Tensor draw_replacement(const at::Tensor& keep, double probability, const RowStreams& streams,
                            int64_t draws) {
  if (draws < keep.size(1)) {
    fail("DSpine replacement: {} draws per row for {} blocks", draws, keep.size(1));
  }
  auto u = streams.uniform(RowDraw::kReplacement, keep.size(0), draws).narrow(1, 0, keep.size(1));
  return (u < probability) & keep.cpu();
}

BlockLayout layout_blocks(const at::Tensor& input_ids, const at::Tensor& loss_mask,
                          const at::Tensor& anchors, const at::Tensor& keep, int64_t block_size,
                          double gamma, const at::Tensor& supervised_slots) {
  const int64_t rows = anchors.size(0), blocks = anchors.size(1);
  const int64_t seq_len = input_ids.size(1);
  BlockLayout layout;
  layout.anchors = anchors;
  layout.keep = keep.to(torch::kBool);
  auto index = anchors.unsqueeze(-1) + torch::arange(block_size, anchors.options());
  layout.source_index = index.clamp_max(seq_len - 1);
  auto flat = layout.source_index.view({rows, blocks * block_size});
  layout.labels = input_ids.gather(1, flat).view({rows, blocks, block_size});
  auto mask_at = (loss_mask.gather(1, flat) > 0.5).view({rows, blocks, block_size});
  auto supervised_slot = (index < seq_len) & layout.keep.unsqueeze(-1) & mask_at;
  // A gap ends supervision for the rest of the block (cumulative product over slots 1..bs-1).
  layout.supervised = supervised_slot.slice(2, 1).to(torch::kInt64).cumprod(2).to(torch::kBool);
  if (supervised_slots.defined()) {  // proposal t (1-based) within the block's limit
    const auto proposal = torch::arange(1, block_size, anchors.options());
    layout.supervised &= proposal.le(supervised_slots.to(anchors.device()).unsqueeze(-1));
  }
  layout.weights = layout.supervised.to(torch::kFloat32);
  if (gamma > 0) {
    auto decay = torch::exp(
        -torch::arange(block_size - 1,
                       torch::TensorOptions().dtype(torch::kFloat32).device(anchors.device())) /
        gamma);
    layout.weights = layout.weights * decay;
  }
  return layout;
}

at::Tensor block_position_ids(const at::Tensor& anchors, int64_t seq_len, int64_t block_size) {
  const int64_t rows = anchors.size(0);
  auto context = torch::arange(seq_len, anchors.options()).unsqueeze(0).expand({rows, seq_len});
  auto blocks =
      (anchors.unsqueeze(-1) + torch::arange(block_size, anchors.options())).view({rows, -1});
  return torch::cat({context, blocks}, 1);
}

at::Tensor block_input_ids(const at::Tensor& input_ids, const at::Tensor& anchors,
                           const at::Tensor& keep, int64_t block_size, int64_t mask_token_id) {
  const int64_t rows = anchors.size(0), blocks = anchors.size(1);
  auto anchor_tokens = input_ids.gather(1, anchors.clamp(0, input_ids.size(1) - 1));
  auto first = torch::where(keep.to(torch::kBool), anchor_tokens, mask_token_id);
  auto ids = torch::full({rows, blocks, block_size}, mask_token_id, input_ids.options());
  ids.select(2, 0).copy_(first);
  return ids.view({rows, blocks * block_size});
}

at::Tensor teacher_positions(const at::Tensor& source_index, int64_t seq_len) {
  const int64_t rows = source_index.size(0);
  const auto batch_row = torch::arange(rows, source_index.options()).view({rows, 1, 1});
  return batch_row * seq_len + (source_index.slice(2, 1) - 1).clamp_min(0);
}

}  // namespace dspine::objectives
