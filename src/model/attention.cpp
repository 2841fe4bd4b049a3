#include "model/attention.h"

#include <torch/torch.h>

#include <cmath>

namespace dspine::model {

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
  auto q = q_norm(q_proj(x).view({rows, queries, heads_, head_dim_})).transpose(1, 2);
  auto k = torch::cat({k_proj(context), k_proj(x)}, 1).view({rows, keys, kv_heads_, head_dim_});
  k = k_norm(k).transpose(1, 2);
  auto v = torch::cat({v_proj(context), v_proj(x)}, 1)
               .view({rows, keys, kv_heads_, head_dim_})
               .transpose(1, 2);
  q = apply_rope(q, rope);
  k = apply_rope(k, rope);

  // GQA by repeating kv heads (query head h uses kv head h / (n_h / n_kv)) rather than
  // enable_gqa, which keeps the memory-efficient masked SDPA kernels eligible on CUDA.
  if (heads_ != kv_heads_) {
    k = k.repeat_interleave(heads_ / kv_heads_, 1);
    v = v.repeat_interleave(heads_ / kv_heads_, 1);
  }
  auto out = at::scaled_dot_product_attention(q, k, v, mask.keys, 0.0, false,
                                              1.0 / std::sqrt(static_cast<double>(head_dim_)));
  out = out * mask.rows_visible.to(out.scalar_type());
  return o_proj(out.transpose(1, 2).reshape({rows, queries, heads_ * head_dim_}));
}

}  // namespace dspine::model
