// DSpine block attention (docs/model.md, "The block attention mask"): queries are the block tokens,
// keys/values are [projected target context | block tokens]; q/k RMSNorm per head, RoPE, GQA; the
// fused block kernels (docs/kernels.md, "Block attention") or dense masked SDPA, by the mask's form.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <utility>

#include "core/config.h"
#include "model/block_mask.h"
#include "model/norm_mlp.h"
#include "model/rope.h"

namespace dspine::model {

class DSpineAttentionImpl : public torch::nn::Module {
 public:
  DSpineAttentionImpl(const core::ModelConfig& config, bool fused);

  // x [B, Q, H] (normed block tokens), context [B, S, H] (normed), the prepared block mask,
  // rope tables for the S+Q positions. Query rows that see no key return zeros.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context,
                        const AttentionMask& mask, const RopeTables& rope);

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};

 private:
  int64_t heads_, kv_heads_, head_dim_;
};
TORCH_MODULE(DSpineAttention);

// The per-head norm then RoPE of x [B, P, heads, D] (tables for its P positions): one fused kernel
// when the norm was built fused and the kernel takes the inputs (docs/kernels.md, "Query/key norm
// and RoPE"), else the two modules.
torch::Tensor norm_then_rope(RMSNorm& norm, const torch::Tensor& x, const RopeTables& rope);

// The dense reference: q [B, Q, H, D], k/v [B, S+Q, KVH, D] (kv heads repeated), SDPA with the
// dense mask, dropped rows zeroed; returns [B, Q, H, D].
torch::Tensor masked_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const AttentionMask& mask, double scale);

// Whether a draft built with `fused` kernels runs its attention through the block kernels for
// hidden states like x: CUDA bf16 and a head layout the kernels take.
bool block_kernels_apply(const core::ModelConfig& config, bool fused, const torch::Tensor& x);

}  // namespace dspine::model
