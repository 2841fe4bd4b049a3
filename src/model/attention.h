// DSpine block attention (docs/model.md, "The block attention mask"): queries are the block tokens,
// keys/values are [projected target context | block tokens]; q/k RMSNorm per head, RoPE, GQA,
// boolean mask.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>

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

}  // namespace dspine::model
