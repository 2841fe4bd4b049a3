#include "model/attention.h"

#include <torch/torch.h>

#include <cmath>

#include "ops/attention_projections.h"
#include "ops/block_attention_ops.h"
#include "ops/qk_norm_rope_ops.h"

namespace dspine::model {

torch::Tensor norm_then_rope(RMSNorm& norm, const torch::Tensor& x, const RopeTables& rope) {
  if (norm->fused && ops::qk_norm_rope_fusable(x, norm->weight, rope.cos, rope.sin)) {
    return ops::qk_norm_rope(x, norm->weight, norm->eps, rope.cos, rope.sin);
  }
  return apply_rope(norm(x), rope);
}

DSpineAttentionImpl::DSpineAttentionImpl(const core::ModelConfig& c, bool fused)
    : heads_(c.num_attention_heads), kv_heads_(c.num_key_value_heads), head_dim_(c.head_dim) {
  auto linear = [](int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
  };
  q_proj = register_module("q_proj", linear(c.hidden_size, heads_ * head_dim_));
  k_proj = register_module("k_proj", linear(c.hidden_size, kv_heads_ * head_dim_));
  v_proj = register_module("v_proj", linear(c.hidden_size, kv_heads_ * head_dim_));
  o_proj = register_module("o_proj", linear(heads_ * head_dim_, c.hidden_size));
  q_norm = register_module("q_norm", RMSNorm(head_dim_, c.rms_norm_eps, fused));
  k_norm = register_module("k_norm", RMSNorm(head_dim_, c.rms_norm_eps, fused));
}

torch::Tensor DSpineAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& context,
                                           const AttentionMask& mask, const RopeTables& rope) {
  const int64_t rows = x.size(0), queries = x.size(1);
  const int64_t keys = context.size(1) + queries;
  // [B, positions, heads, head_dim] throughout: the layout of the projections and of the kernels.
  // With fused kernels one node projects q, k and v; its backward sums their input gradients
  // inside the GEMMs (docs/model.md, "Attention projections").
  auto [q_flat, k_flat, v_flat] =
      q_norm->fused
          ? ops::attention_projections(x, context, q_proj->weight, k_proj->weight, v_proj->weight)
          : ops::AttentionProjections{q_proj(x), torch::cat({k_proj(context), k_proj(x)}, 1),
                                      torch::cat({v_proj(context), v_proj(x)}, 1)};
  auto q = norm_then_rope(q_norm, q_flat.view({rows, queries, heads_, head_dim_}), rope);
  auto k = norm_then_rope(k_norm, k_flat.view({rows, keys, kv_heads_, head_dim_}), rope);
  auto v = v_flat.view({rows, keys, kv_heads_, head_dim_});
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  auto out = mask.dense() ? masked_attention(q, k, v, mask, scale)
                          : ops::block_attention(q, k, v, mask.anchors, mask.keep,
                                                 mask.block_size, scale);
  return o_proj(out.reshape({rows, queries, heads_ * head_dim_}));
}

torch::Tensor masked_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const AttentionMask& mask, double scale) {
  auto qt = q.transpose(1, 2), kt = k.transpose(1, 2), vt = v.transpose(1, 2);
  // GQA by repeating kv heads (query head h uses kv head h / (n_h / n_kv)) rather than
  // enable_gqa, which keeps the memory-efficient masked SDPA kernels eligible on CUDA.
  const int64_t repeats = q.size(2) / k.size(2);
  if (repeats != 1) {
    kt = kt.repeat_interleave(repeats, 1);
    vt = vt.repeat_interleave(repeats, 1);
  }
  auto out = at::scaled_dot_product_attention(qt, kt, vt, mask.keys, 0.0, false, scale);
  out = out * mask.rows_visible.to(out.scalar_type());
  return out.transpose(1, 2);
}

bool block_kernels_apply(const core::ModelConfig& c, bool fused, const torch::Tensor& x) {
  return fused && x.is_cuda() && x.scalar_type() == torch::kBFloat16 &&
         ops::block_attention_heads_supported(c.num_attention_heads, c.num_key_value_heads,
                                              c.head_dim, c.block_size);
}

}  // namespace dspine::model
