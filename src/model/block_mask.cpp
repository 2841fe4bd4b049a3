#include "model/block_mask.h"

#include <torch/torch.h>

namespace dspine::model {

at::Tensor block_attention_mask(const at::Tensor& anchors, const at::Tensor& keep, int64_t seq_len,
                                int64_t block_size) {
  const auto device = anchors.device();
  const int64_t rows = anchors.size(0);
  const int64_t queries = anchors.size(1) * block_size;
  auto long_opts = torch::TensorOptions().dtype(torch::kInt64).device(device);

  auto query_anchor = anchors.repeat_interleave(block_size, 1);  // [B, Q]
  auto query_keep = keep.to(torch::kBool).repeat_interleave(block_size, 1);
  auto context = torch::arange(seq_len, long_opts).view({1, 1, seq_len}) <
                 query_anchor.unsqueeze(-1);  // [B, Q, S]

  auto index = torch::arange(queries, long_opts);
  auto block = torch::div(index, block_size, "floor");
  auto same_block = block.unsqueeze(1) == block.unsqueeze(0);
  auto causal = (index % block_size).unsqueeze(0) <= (index % block_size).unsqueeze(1);
  auto draft = (same_block & causal).unsqueeze(0).expand({rows, queries, queries});

  auto mask = torch::cat({context, draft}, -1) & query_keep.unsqueeze(-1);
  return mask.unsqueeze(1);
}

AttentionMask prepare_attention_mask(const at::Tensor& mask) {
  auto visible = mask.any(-1, /*keepdim=*/true);
  AttentionMask prepared;
  prepared.keys = mask | visible.logical_not();
  prepared.rows_visible = visible;
  return prepared;
}

AttentionMask block_form_attention_mask(const at::Tensor& anchors, const at::Tensor& keep,
                                        int64_t block_size) {
  AttentionMask prepared;
  prepared.anchors = anchors;
  prepared.keep = keep;
  prepared.block_size = block_size;
  return prepared;
}

}  // namespace dspine::model
