// A small seeded "target model": a few Qwen3-style decoder layers (RMSNorm, GQA attention with
// RoPE and q/k norms, SwiGLU MLP) with random weights and its own embedding / lm_head. It samples
// token sequences autoregressively and exposes the hidden states a draft model trains on.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/config.h"
#include "data/batch.h"

namespace dspine::data {

class SyntheticTarget {
 public:
  // Dimensions: hidden_size / vocab_size / target_layer_ids from `model`, the rest from `target`.
  // Weights are a pure function of target.seed.
  SyntheticTarget(const core::ModelConfig& model, const core::SyntheticTargetConfig& target);

  // Sample number `index` (a pure function of seed and index): a sequence of `seq_len` tokens
  // drawn from the target itself, with a batch dimension of 1.
  DraftBatch sample(int64_t index, int64_t seq_len) const;

  // Runs the target on given ids [B, S]: fills hidden_states and target_last_hidden_states.
  DraftBatch run(const at::Tensor& input_ids) const;

  // Next-token logits [B, S, V] (after logit_scale) for given ids; used by tests.
  at::Tensor logits(const at::Tensor& input_ids) const;

  const at::Tensor& embed_tokens() const { return embed_tokens_; }  // [V, H]
  const at::Tensor& lm_head() const { return lm_head_; }            // [V, H]

 private:
  struct Layer {
    at::Tensor input_norm, q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
    at::Tensor post_attention_norm, gate_proj, up_proj, down_proj;
  };
  at::Tensor layer_forward(const Layer& layer, const at::Tensor& x) const;

  core::ModelConfig model_;
  core::SyntheticTargetConfig target_;
  at::Tensor embed_tokens_, lm_head_, final_norm_;
  std::vector<Layer> layers_;
};

}  // namespace dspine::data
