// One pre-norm Qwen3 decoder layer of the DSpine draft (docs/model.md, "Backbone layers"): the
// context is already normed by hidden_norm and does not pass through input_layernorm.
#pragma once

#include <torch/nn/module.h>

#include "core/config.h"
#include "model/attention.h"
#include "model/norm_mlp.h"

namespace dspine::model {

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const core::ModelConfig& config, bool fused);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context,
                        const AttentionMask& mask, const RopeTables& rope);

  DSpineAttention self_attn{nullptr};
  SwiGLUMLP mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(DecoderLayer);

}  // namespace dspine::model
