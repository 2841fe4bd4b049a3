// A Qwen3 causal language model (inference only): the forward that real targets (Hugging Face
// checkpoints) and the built-in synthetic target share. Decoder layers follow HF's Qwen3 exactly:
// RMSNorm (fp32 variance, cast back, then weight), GQA attention with per-head q/k RMSNorm and
// RoPE, SwiGLU MLP, final norm; lm_head tied to the embedding or not. docs/target.md describes
// the layer-id convention and what a checkpoint must contain.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "core/row_spans.h"

namespace dspine::target {

// The rotary position embedding of a Qwen3 model as transformers 5 computes it
// (modeling_rope_utils.py): plain RoPE of base rope_theta, or YaRN. read_qwen3_config fills the
// YaRN fields with transformers' defaults resolved; plain RoPE reads none of them.
struct Qwen3Rope {
  enum class Type { kDefault, kYarn };
  Type type = Type::kDefault;
  double factor = 1.0;            // YaRN: how much longer the context is than in pre-training
  double attention_factor = 1.0;  // YaRN: cos and sin are multiplied by it
  double beta_fast = 32.0;        // YaRN: the correction range, in rotations over the
  double beta_slow = 1.0;         //   pre-training context
  bool truncate = true;           // YaRN: the correction range rounded out to whole dimensions
  int64_t original_max_position_embeddings = 0;  // YaRN: the pre-training context length
};

// The dimensions of a Qwen3 model, from a HF config.json (model_type qwen3) or built in code.
struct Qwen3Dims {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;  // transformers Qwen3Config defaults
  bool tie_word_embeddings = false;
  Qwen3Rope rope;  // plain RoPE unless config.json asks for YaRN
};

// Reads and checks a HF config.json, in the layout of transformers 5 (rope_parameters) or of
// transformers 4 (top-level rope_theta, rope_scaling). Unsupported settings (model_type other
// than qwen3, attention_bias, a RoPE type other than default and yarn, partial_rotary_factor,
// use_sliding_window), RoPE values that the two layouts give differently, and missing or
// mistyped keys throw dspine::Error naming the file and the key.
Qwen3Dims read_qwen3_config(const std::string& config_json_path);

// Throws dspine::Error (naming `where`) unless every size is positive, the heads divide evenly,
// head_dim is even and the RoPE constants are positive.
void check_qwen3_dims(const Qwen3Dims& dims, const std::string& where);

// A weight under its HF name ("model.layers.0.self_attn.q_proj.weight", ...) and the file it
// came from (named in errors).
struct Qwen3Weight {
  std::string name;
  at::Tensor tensor;
  std::string file;
};
using Qwen3Weights = std::vector<Qwen3Weight>;

class Qwen3Model {
 public:
  // A HF Qwen3 directory: config.json, then model.safetensors or model.safetensors.index.json
  // (sharded); tied or untied embeddings; loaded in `dtype` on `device`.
  static Qwen3Model load_hf(const std::string& dir, at::ScalarType dtype,
                            const c10::Device& device);

  // From HF-named weights: every expected tensor exactly once with its HF shape, nothing else
  // (lm_head.weight absent iff tied). `source` (a directory, say) is named when one is missing.
  static Qwen3Model from_weights(const Qwen3Dims& dims, Qwen3Weights weights, at::ScalarType dtype,
                                 const c10::Device& device, const std::string& source);

  // Seeded random weights of the given dims (a pure function of dims and seed, on any device of
  // one type): norms at 1 (q_norm at 2 for sharper attention), projections N(0, 1/fan_in),
  // embedding N(0, 1), an untied lm_head scaled so that the next-token distribution is peaked
  // alike at any vocabulary size. For GPU benchmarks with a full-size target, and for tests.
  static Qwen3Model random(const Qwen3Dims& dims, uint64_t seed, at::ScalarType dtype,
                           const c10::Device& device);

  struct Outputs {
    at::Tensor hidden_states;      // [B, S, K*H]: outputs of decoder layers layer_ids, concatenated
    at::Tensor last_hidden_state;  // [B, S, H]: after the final norm
  };

  // The whole sequence, causal, no gradients. hidden_states[..., i*H:(i+1)*H] is the output of
  // decoder layer layer_ids[i] (0-based; HF's output_hidden_states[layer_ids[i] + 1]).
  Outputs forward(const at::Tensor& input_ids, const std::vector<int64_t>& layer_ids) const;

  // Keys and values of the positions run so far, per layer [B, kv_heads, capacity, head_dim],
  // and RoPE's cos and sin of every position of the capacity [capacity, head_dim] (a step with
  // rows at their own places gathers its rows' instead of computing them).
  struct KvCache {
    std::vector<at::Tensor> keys, values;
    at::Tensor rope_cos, rope_sin;
    int64_t length = 0;  // positions filled
  };
  KvCache new_cache(int64_t batch, int64_t capacity) const;

  // Runs ids [B, T] at positions cache.length .. cache.length + T - 1, appending their keys and
  // values; the outputs cover those T positions only. Equals forward() on the whole prefix.
  Outputs step(const at::Tensor& input_ids, KvCache& cache,
               const std::vector<int64_t>& layer_ids = {}) const;

  // Each row at its own place (batched decoding, where rows accept different numbers of drafted
  // tokens): ids [B, T] of row b run at positions row_lengths[b] .. row_lengths[b] + T - 1, see
  // the row's first row_lengths[b] cached positions and their own tokens up to themselves, and
  // their keys and values are written at those positions. cache.length is neither read nor
  // changed: the caller keeps each row's length (and may keep only part of what was written).
  // Row b's outputs equal forward() over its first row_lengths[b] cached tokens and these.
  Outputs step_rows(const at::Tensor& input_ids, KvCache& cache,
                    const std::vector<int64_t>& row_lengths,
                    const std::vector<int64_t>& layer_ids = {}) const;

  // step_rows at `spans` (core::row_spans of the row lengths [B] on the model's device, T
  // positions each, its bias in the model's dtype), attention over the first spans.keys cached
  // positions (at most the capacity). Nothing is read back from the device and the ids are not
  // checked (the caller's own choices), so a CUDA graph can capture it (docs/decoding.md, "CUDA
  // graphs"); fixed spans.keys give fixed shapes.
  Outputs step_rows(const at::Tensor& input_ids, KvCache& cache, const core::RowSpans& spans,
                    const std::vector<int64_t>& layer_ids = {}) const;

  // Many continuations of a cached context, none appended to it: block n of row b holds the
  // tokens ids[b, n, :] at positions context_length[b, n] .. context_length[b, n] + L - 1, and
  // each attends to the row's first context_length[b, n] cached positions and to its own block up
  // to itself, so it equals forward() over that context prefix followed by the block (softmax in
  // fp32 here). Verifying drafted blocks costs the blocks' tokens only, not a context pass each.
  // ids [B, N, L] int64, context_length [B, N] int64 in [1, cache.length] (cache of batch B).
  // Returns the final-norm states [B, N, L, H].
  at::Tensor branch(const at::Tensor& ids, const at::Tensor& context_length,
                    const KvCache& context) const;

  // Next-token logits (in the model's dtype) of final-norm states [..., H]: [..., V].
  at::Tensor logits(const at::Tensor& last_hidden_state) const;

  // On CUDA in bf16 or fp16 the norms, q/k norm + RoPE and SwiGLU run through the project's fused
  // kernels (fp32 inside, rounded once; docs/kernels.md), q/k/v and gate/up as one GEMM each and
  // the MLP's residual added in the down projection's GEMM; elsewhere, and after
  // use_fused_kernels(false), through HF's ATen composition.
  bool fused_kernels() const { return fused_; }
  void use_fused_kernels(bool on) { fused_ = on; }

  const at::Tensor& embed_tokens() const { return embed_tokens_; }  // [V, H]
  const at::Tensor& lm_head() const { return lm_head_; }  // [V, H]; embed_tokens' storage if tied
  const Qwen3Dims& dims() const { return dims_; }

  // One decoder layer's weights (HF names without "model.layers.{i}."). q/k/v and gate/up are
  // row blocks of one packed weight each (views; the fused path's GEMMs read the packed ones).
  struct Layer {
    at::Tensor input_layernorm, q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
    at::Tensor post_attention_layernorm, gate_proj, up_proj, down_proj;
    at::Tensor qkv_proj, gate_up_proj;  // [q; k; v] and [gate; up]
  };

 private:
  struct Slot;  // a weight's HF name, shape and member
  Qwen3Model() = default;
  std::vector<Slot> slots();  // every weight of dims_ (lm_head only when untied)
  void pack_projections();    // fills qkv_proj / gate_up_proj, the separate weights their views
  // spans null: every row at the cache's shared length; else each row at its own place. The ids
  // are checked by the callers.
  Outputs run(const at::Tensor& input_ids, KvCache* cache, const std::vector<int64_t>& layer_ids,
              const core::RowSpans* spans = nullptr) const;

  Qwen3Dims dims_;
  at::Tensor inv_freq_;  // [head_dim / 2] fp32 on the model's device, from dims_' RoPE
  at::Tensor embed_tokens_, lm_head_, final_norm_;
  std::vector<Layer> layers_;
  bool fused_ = false;
};

}  // namespace dspine::target
