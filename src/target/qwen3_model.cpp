#include "target/qwen3_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <optional>
#include <unordered_map>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/ranges.h>

#include "core/device_generator.h"
#include "core/error.h"
#include "core/row_spans.h"
#include "core/seeding.h"
#include "ops/qk_norm_rope_ops.h"
#include "ops/rms_norm_ops.h"
#include "ops/swiglu_ops.h"

namespace dspine::target {

struct Qwen3Model::Slot {
  std::string name;
  std::vector<int64_t> shape;
  at::Tensor* tensor;
};

namespace {

// random(): attention logits get this extra gain through q_norm's weight. With unit-RMS queries
// and keys the scores would have std ~1 and attention would be nearly uniform; sharper attention
// makes the next token depend on specific earlier tokens, not on a blurred average of the prefix.
constexpr double kQueryNormGain = 2.0;
// random(): lm_head rows are drawn so that the logits of a unit-RMS final state have std
// kHeadGain * sqrt(2 ln V). The max of V Gaussians sits ~sqrt(2 ln V) std above the mean, so this
// keeps the peakedness roughly independent of the vocabulary size; 1.5 gives a mean top-1
// probability of ~0.6 (entropy ~1.3 nats, varying by context) at the tiny default sizes.
constexpr double kHeadGain = 1.5;

// HF's Qwen3RMSNorm: variance in fp32, normalised value cast back to the input dtype, then
// multiplied by the weight (which sets the result dtype).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const auto x32 = x.to(at::kFloat);
  const auto normed = x32 * at::rsqrt(x32.square().mean(-1, /*keepdim=*/true).add_(eps));
  return weight * normed.to(x.scalar_type());
}

// The same norm through the project's fused kernel when the model runs fused and the kernel takes
// x (docs/kernels.md, "RMSNorm and SwiGLU"): fp32 inside, rounded once.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, bool fused) {
  return fused && ops::rms_norm_fusable(x, weight) ? ops::rms_norm_fused(x, weight, eps)
                                                   : rms_norm(x, weight, eps);
}

// The inverse frequencies [head_dim / 2], fp32 on the CPU, with the operations transformers 5
// uses, in its order and precision (fp32 tensors; Python's floats are doubles here), so that they
// agree bit for bit: Qwen3RotaryEmbedding.compute_default_rope_parameters for plain RoPE and
// _compute_yarn_parameters for YaRN, which blends interpolated (divided by factor) and original
// frequencies over a linear ramp between the correction dimensions of beta_fast and beta_slow.
at::Tensor rope_inv_freq(const Qwen3Dims& dims) {
  const int64_t dim = dims.head_dim;
  const double base = dims.rope_theta;
  const auto exponents = at::arange(0, dim, 2, at::kLong).to(at::kFloat).div_(double(dim));
  const auto pos_freqs = at::pow(base, exponents);
  if (dims.rope.type == Qwen3Rope::Type::kDefault) return at::reciprocal(pos_freqs);

  const Qwen3Rope& yarn = dims.rope;
  constexpr double kPi = 3.141592653589793;  // Python's math.pi
  const auto correction_dim = [&](double rotations) {
    return (double(dim) *
            std::log(double(yarn.original_max_position_embeddings) / (rotations * 2 * kPi))) /
           (2 * std::log(base));
  };
  double low = correction_dim(yarn.beta_fast), high = correction_dim(yarn.beta_slow);
  if (yarn.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
  const auto ramp = at::arange(dim / 2, at::kFloat).sub(low).div(high - low).clamp(0, 1);
  const auto extrapolation_factor = at::rsub(ramp, 1);
  const auto extrapolation = at::reciprocal(pos_freqs);
  const auto interpolation = at::reciprocal(pos_freqs * yarn.factor);
  return interpolation * at::rsub(extrapolation_factor, 1) + extrapolation * extrapolation_factor;
}

// RoPE tables and the attention mask of the positions past .. past + count - 1.
struct Positions {
  // [count, head_dim] in the model's dtype; rows at their own positions: [B, 1, count, head_dim]
  at::Tensor cos, sin;
  // [count, past + count] bool: only for count > 1 after a cache; rows at their own positions:
  // the spans' additive bias [B, 1, count, keys]
  std::optional<at::Tensor> mask;
  bool causal = false;
  at::Tensor batch_cos, batch_sin;  // fused runs: [B, count, head_dim], the q/k kernel's tables
  // Rows at their own positions (Qwen3Model::step_rows): where each token's keys and values go
  // and what it sees.
  std::optional<core::RowSpans> spans;
};

// cos and sin [..., head_dim] of RoPE at `position` [...] (fp32), as transformers computes them:
// angles as fp32 products, cos/sin in fp32 scaled by YaRN's attention factor, then cast to `dtype`.
std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& position,
                                              const at::Tensor& inv_freq, const Qwen3Rope& rope,
                                              at::ScalarType dtype) {
  const double scaling = rope.type == Qwen3Rope::Type::kYarn ? rope.attention_factor : 1.0;
  const auto angles = position.unsqueeze(-1) * inv_freq;  // [..., head_dim / 2]
  const auto both = at::cat({angles, angles}, -1);
  return {(both.cos() * scaling).to(dtype), (both.sin() * scaling).to(dtype)};
}

Positions make_positions(int64_t past, int64_t count, const at::Tensor& inv_freq,
                         const Qwen3Rope& rope, const at::TensorOptions& options) {
  const auto position = at::arange(past, past + count, options.dtype(at::kFloat));
  auto [cos, sin] = rope_tables(position, inv_freq, rope, options.dtype().toScalarType());
  Positions out;
  out.cos = std::move(cos);
  out.sin = std::move(sin);
  if (count > 1 && past == 0) {
    out.causal = true;
  } else if (count > 1) {  // query i sees keys 0 .. past + i
    const auto keys = at::arange(past + count, options.dtype(at::kLong)).unsqueeze(0);
    out.mask = keys.le(at::arange(past, past + count, options.dtype(at::kLong)).unsqueeze(1));
  }
  return out;
}

// Rows at their own places (`spans`): RoPE's tables gathered from the cache's per-position ones.
Positions make_row_positions(const core::RowSpans& spans, const Qwen3Model::KvCache& cache) {
  Positions out;
  out.spans = spans;
  out.batch_cos = core::rows_at(cache.rope_cos, spans.positions);
  out.batch_sin = core::rows_at(cache.rope_sin, spans.positions);
  out.cos = out.batch_cos.unsqueeze(1);
  out.sin = out.batch_sin.unsqueeze(1);
  out.mask = spans.bias.to(cache.rope_cos.scalar_type());  // the same tensor when the dtypes agree
  return out;
}

// x [..., d] rotated by the rotate-half convention of Qwen3 (cos and sin broadcast to x).
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const auto halves = x.chunk(2, -1);
  return x * cos + at::cat({halves[1].neg(), halves[0]}, -1) * sin;
}

void check_input_ids(const at::Tensor& ids, int64_t vocab) {
  if (ids.dim() != 2 || ids.scalar_type() != at::kLong || ids.size(1) < 1) {
    fail("Qwen3 model: input_ids must be [B, S] int64 with S >= 1, got [{}] {}",
         fmt::join(ids.sizes(), ", "), c10::toString(ids.scalar_type()));
  }
  if (ids.numel() > 0 && (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= vocab)) {
    fail("Qwen3 model: input_ids outside the vocabulary [0, {})", vocab);
  }
}

void check_dtype(at::ScalarType dtype) {
  if (!at::isFloatingType(dtype)) {
    fail("Qwen3 model: dtype must be floating point, got {}", c10::toString(dtype));
  }
}

}  // namespace

void check_qwen3_dims(const Qwen3Dims& d, const std::string& where) {
  if (d.hidden_size < 1 || d.intermediate_size < 1 || d.num_hidden_layers < 1 ||
      d.num_attention_heads < 1 || d.num_key_value_heads < 1 || d.vocab_size < 1) {
    fail(
        "{}: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, "
        "num_key_value_heads and vocab_size must be positive",
        where);
  }
  if (d.num_attention_heads % d.num_key_value_heads != 0) {
    fail("{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", where,
         d.num_attention_heads, d.num_key_value_heads);
  }
  if (d.head_dim < 2 || d.head_dim % 2 != 0) {
    fail("{}: head_dim must be even and >= 2 for RoPE (got {})", where, d.head_dim);
  }
  if (!(d.rms_norm_eps > 0.0) || !(d.rope_theta > 0.0)) {
    fail("{}: rms_norm_eps and rope_theta must be > 0 (got {} and {})", where, d.rms_norm_eps,
         d.rope_theta);
  }
  const Qwen3Rope& r = d.rope;
  if (r.type == Qwen3Rope::Type::kYarn &&
      (!(r.factor > 0.0) || !(r.attention_factor > 0.0) || !(r.beta_fast > 0.0) ||
       !(r.beta_slow > 0.0) || r.original_max_position_embeddings < 1)) {
    fail(
        "{}: YaRN's factor, attention_factor, beta_fast, beta_slow and "
        "original_max_position_embeddings must be > 0 (got {}, {}, {}, {} and {})",
        where, r.factor, r.attention_factor, r.beta_fast, r.beta_slow,
        r.original_max_position_embeddings);
  }
}

std::vector<Qwen3Model::Slot> Qwen3Model::slots() {
  const int64_t hidden = dims_.hidden_size, inter = dims_.intermediate_size;
  const int64_t q_width = dims_.num_attention_heads * dims_.head_dim;
  const int64_t kv_width = dims_.num_key_value_heads * dims_.head_dim;
  layers_.resize(static_cast<size_t>(dims_.num_hidden_layers));
  std::vector<Slot> out{{"model.embed_tokens.weight", {dims_.vocab_size, hidden}, &embed_tokens_}};
  for (size_t l = 0; l < layers_.size(); ++l) {
    const std::string prefix = fmt::format("model.layers.{}.", l);
    Layer& layer = layers_[l];
    out.push_back({prefix + "input_layernorm.weight", {hidden}, &layer.input_layernorm});
    out.push_back({prefix + "self_attn.q_proj.weight", {q_width, hidden}, &layer.q_proj});
    out.push_back({prefix + "self_attn.k_proj.weight", {kv_width, hidden}, &layer.k_proj});
    out.push_back({prefix + "self_attn.v_proj.weight", {kv_width, hidden}, &layer.v_proj});
    out.push_back({prefix + "self_attn.o_proj.weight", {hidden, q_width}, &layer.o_proj});
    out.push_back({prefix + "self_attn.q_norm.weight", {dims_.head_dim}, &layer.q_norm});
    out.push_back({prefix + "self_attn.k_norm.weight", {dims_.head_dim}, &layer.k_norm});
    out.push_back(
        {prefix + "post_attention_layernorm.weight", {hidden}, &layer.post_attention_layernorm});
    out.push_back({prefix + "mlp.gate_proj.weight", {inter, hidden}, &layer.gate_proj});
    out.push_back({prefix + "mlp.up_proj.weight", {inter, hidden}, &layer.up_proj});
    out.push_back({prefix + "mlp.down_proj.weight", {hidden, inter}, &layer.down_proj});
  }
  out.push_back({"model.norm.weight", {hidden}, &final_norm_});
  if (!dims_.tie_word_embeddings) {
    out.push_back({"lm_head.weight", {dims_.vocab_size, hidden}, &lm_head_});
  }
  return out;
}

void Qwen3Model::pack_projections() {
  const auto pack = [](at::Tensor& packed, std::initializer_list<at::Tensor*> parts) {
    std::vector<at::Tensor> rows;
    for (at::Tensor* part : parts) rows.push_back(*part);
    packed = at::cat(rows, 0);
    int64_t start = 0;
    for (at::Tensor* part : parts) {
      const int64_t count = part->size(0);
      *part = packed.narrow(0, start, count);
      start += count;
    }
  };
  for (Layer& layer : layers_) {
    pack(layer.qkv_proj, {&layer.q_proj, &layer.k_proj, &layer.v_proj});
    pack(layer.gate_up_proj, {&layer.gate_proj, &layer.up_proj});
  }
}

Qwen3Model Qwen3Model::from_weights(const Qwen3Dims& dims, Qwen3Weights weights,
                                    at::ScalarType dtype, const c10::Device& device,
                                    const std::string& source) {
  check_qwen3_dims(dims, source);
  check_dtype(dtype);
  Qwen3Model model;
  model.dims_ = dims;
  std::unordered_map<std::string, Slot> by_name;
  for (Slot& slot : model.slots()) by_name.emplace(slot.name, slot);
  for (Qwen3Weight& weight : weights) {
    const auto found = by_name.find(weight.name);
    if (found == by_name.end()) {
      fail("{}: unexpected tensor '{}' (not a weight of this Qwen3 model{})", weight.file,
           weight.name,
           weight.name == "lm_head.weight" ? ": config.json says tie_word_embeddings" : "");
    }
    const Slot& slot = found->second;
    if (slot.tensor->defined()) fail("{}: tensor '{}' appears twice", weight.file, weight.name);
    if (weight.tensor.sizes() != at::IntArrayRef(slot.shape) ||
        !at::isFloatingType(weight.tensor.scalar_type())) {
      fail("{}: tensor '{}' is [{}] {}, expected [{}] floating point", weight.file, weight.name,
           fmt::join(weight.tensor.sizes(), ", "), c10::toString(weight.tensor.scalar_type()),
           fmt::join(slot.shape, ", "));
    }
    *slot.tensor = weight.tensor.to(device, dtype).contiguous();
    weight.tensor = at::Tensor();  // frees the loaded copy as the model fills up
  }
  for (const auto& [name, slot] : by_name) {
    if (!slot.tensor->defined()) fail("{}: missing tensor '{}'", source, name);
  }
  if (dims.tie_word_embeddings) model.lm_head_ = model.embed_tokens_;
  model.pack_projections();
  model.inv_freq_ = rope_inv_freq(dims).to(device);
  model.fused_ = device.is_cuda() && (dtype == at::kBFloat16 || dtype == at::kHalf);
  return model;
}

Qwen3Model Qwen3Model::random(const Qwen3Dims& dims, uint64_t seed, at::ScalarType dtype,
                              const c10::Device& device) {
  check_qwen3_dims(dims, "Qwen3Model::random");
  check_dtype(dtype);
  at::NoGradGuard no_grad;
  Qwen3Model model;
  model.dims_ = dims;
  const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
  const double head_std = kHeadGain * std::sqrt(2.0 * std::log(double(dims.vocab_size))) /
                          std::sqrt(double(dims.hidden_size));
  const std::vector<Slot> slots = model.slots();
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& slot = slots[i];
    at::Tensor value;
    if (slot.shape.size() == 1) {  // norms
      const bool query = slot.name.find("q_norm") != std::string::npos;
      value = at::full(slot.shape, query ? kQueryNormGain : 1.0, options);
    } else {
      // Input projections keep unit-RMS activations at unit scale; the residual branches
      // (o_proj, down_proj) add O(1) per layer, so the stream grows slowly and every layer
      // still matters. Each tensor has its own stream: values do not depend on the others.
      const double std = slot.name == "model.embed_tokens.weight" ? 1.0
                         : slot.name == "lm_head.weight"          ? head_std
                                                         : 1.0 / std::sqrt(double(slot.shape[1]));
      at::Generator gen =
          core::seeded_generator(device, core::generator_seed(core::stream_seed(
                                             static_cast<int64_t>(seed), static_cast<int64_t>(i))));
      value = at::empty(slot.shape, options).normal_(0.0, std, gen);
    }
    *slot.tensor = value.to(dtype);
  }
  if (dims.tie_word_embeddings) model.lm_head_ = model.embed_tokens_;
  model.pack_projections();
  model.inv_freq_ = rope_inv_freq(dims).to(device);
  model.fused_ = device.is_cuda() && (dtype == at::kBFloat16 || dtype == at::kHalf);
  return model;
}

Qwen3Model::KvCache Qwen3Model::new_cache(int64_t batch, int64_t capacity) const {
  if (batch < 1 || capacity < 1) {
    fail("Qwen3 model: a KV cache needs batch >= 1 and capacity >= 1 (got {} and {})", batch,
         capacity);
  }
  // Zeros, not empty: step_rows attends over the longest row's positions, masking the rest, and a
  // masked value still enters the product with weight 0, where 0 · NaN would be NaN.
  KvCache cache;
  for (size_t l = 0; l < layers_.size(); ++l) {
    for (auto* list : {&cache.keys, &cache.values}) {
      list->push_back(at::zeros({batch, dims_.num_key_value_heads, capacity, dims_.head_dim},
                                embed_tokens_.options()));
    }
  }
  std::tie(cache.rope_cos, cache.rope_sin) =
      rope_tables(at::arange(capacity, embed_tokens_.options().dtype(at::kFloat)), inv_freq_,
                  dims_.rope, embed_tokens_.scalar_type());
  return cache;
}

namespace {

// The second half of a decoder layer: out = residual + attention (the attention block's output),
// then out + the SwiGLU MLP of its post-attention norm. Fused, the add and the norm are one kernel
// and silu(gate) · up another.
at::Tensor mlp_residual(const Qwen3Model::Layer& layer, const Qwen3Dims& dims,
                        const at::Tensor& residual, const at::Tensor& attention, bool fused) {
  const auto& weight = layer.post_attention_layernorm;
  at::Tensor out, h;
  if (fused && ops::rms_norm_fusable(attention, weight) && residual.sizes() == attention.sizes() &&
      residual.scalar_type() == attention.scalar_type()) {
    std::tie(out, h) = ops::add_rms_norm_fused(attention, residual, weight, dims.rms_norm_eps);
  } else {
    out = residual + attention;
    h = rms_norm(out, weight, dims.rms_norm_eps);
  }
  if (!fused) {
    return out + at::linear(at::silu(at::linear(h, layer.gate_proj)) * at::linear(h, layer.up_proj),
                            layer.down_proj);
  }
  // out is this function's own tensor and no gradient is taken: the GEMM adds into it (β = 1).
  return ops::swiglu_mlp_add_(out, h, layer.gate_up_proj, layer.down_proj, /*fused=*/true);
}

// Per-head RMSNorm then RoPE of projections [B, T, heads, d], returned as [B, heads, T, d]:
// one fused kernel when the tables for it exist and it takes the inputs.
at::Tensor norm_rope(const at::Tensor& x, const at::Tensor& weight, double eps,
                     const Positions& positions) {
  if (positions.batch_cos.defined() &&
      ops::qk_norm_rope_fusable(x, weight, positions.batch_cos, positions.batch_sin)) {
    return ops::qk_norm_rope(x, weight, eps, positions.batch_cos, positions.batch_sin)
        .transpose(1, 2);
  }
  return rotate(rms_norm(x, weight, eps).transpose(1, 2), positions.cos, positions.sin);
}

// Decoder layer `index` on x [B, T, H]; with a cache, attends to its positions too and appends
// this call's keys and values to it.
at::Tensor layer_forward(const Qwen3Model::Layer& layer, const Qwen3Dims& dims, const at::Tensor& x,
                         const Positions& positions, Qwen3Model::KvCache* cache, size_t index,
                         bool fused) {
  const int64_t batch = x.size(0), count = x.size(1), dim = dims.head_dim;
  const int64_t heads = dims.num_attention_heads, kv_heads = dims.num_key_value_heads;
  const double eps = dims.rms_norm_eps;

  auto h = rms_norm(x, layer.input_layernorm, eps, fused);
  at::Tensor q_rows, k_rows, v_rows;  // [B, T, heads · dim]
  if (fused) {                        // one GEMM; the three are column blocks of its output
    const auto qkv = at::linear(h, layer.qkv_proj);
    const int64_t q_width = heads * dim, kv_width = kv_heads * dim;
    q_rows = qkv.narrow(-1, 0, q_width);
    k_rows = qkv.narrow(-1, q_width, kv_width);
    v_rows = qkv.narrow(-1, q_width + kv_width, kv_width);
  } else {
    q_rows = at::linear(h, layer.q_proj);
    k_rows = at::linear(h, layer.k_proj);
    v_rows = at::linear(h, layer.v_proj);
  }
  // Per-head RMSNorm of queries and keys (before RoPE), as in HF's Qwen3Attention.
  auto q = norm_rope(q_rows.view({batch, count, heads, dim}), layer.q_norm, eps, positions);
  auto k = norm_rope(k_rows.view({batch, count, kv_heads, dim}), layer.k_norm, eps, positions);
  auto v = v_rows.view({batch, count, kv_heads, dim}).transpose(1, 2);
  if (cache != nullptr && positions.spans) {
    // [B, C, kv, d] views of the cache: one scatter writes every row's tokens at its positions.
    core::write_spans(cache->keys[index].transpose(1, 2), k.transpose(1, 2), *positions.spans);
    core::write_spans(cache->values[index].transpose(1, 2), v.transpose(1, 2), *positions.spans);
    k = cache->keys[index].narrow(2, 0, positions.spans->keys);
    v = cache->values[index].narrow(2, 0, positions.spans->keys);
  } else if (cache != nullptr) {
    const int64_t past = cache->length;
    cache->keys[index].narrow(2, past, count).copy_(k);
    cache->values[index].narrow(2, past, count).copy_(v);
    k = cache->keys[index].narrow(2, 0, past + count);
    v = cache->values[index].narrow(2, 0, past + count);
  }
  const auto attn =
      at::scaled_dot_product_attention(q, k, v, positions.mask, 0.0, positions.causal, std::nullopt,
                                       /*enable_gqa=*/true);
  return mlp_residual(
      layer, dims, x,
      at::linear(attn.transpose(1, 2).reshape({batch, count, heads * dim}), layer.o_proj), fused);
}

// Attention of branch tokens (Qwen3Model::branch) to their row's cached context and to their own
// block, one exact softmax over both parts, in fp32. q [B, N, L, heads, d], k and v
// [B, N, L, kv_heads, d] (q and k normed and rotated), the context's keys and values
// [B, kv_heads, C, d], context_length [B, N]. Returns [B, N, L, heads·d] in q's dtype.
at::Tensor branch_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& context_keys, const at::Tensor& context_values,
                            const at::Tensor& context_length) {
  const int64_t batch = q.size(0), blocks = q.size(1), length = q.size(2), heads = q.size(3);
  const int64_t dim = q.size(4), kv_heads = k.size(3), group = heads / kv_heads;
  const int64_t context = context_keys.size(2), rows = length * group;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  const double minus_inf = -std::numeric_limits<double>::infinity();
  // Queries grouped by their key-value head: [B, kv, N, L·g, d], row l·g + i is token l, head i.
  const auto queries = q.to(at::kFloat)
                           .view({batch, blocks, length, kv_heads, group, dim})
                           .permute({0, 3, 1, 2, 4, 5})
                           .reshape({batch, kv_heads, blocks, rows, dim});
  auto context_scores = at::matmul(queries.view({batch, kv_heads, blocks * rows, dim}),
                                   context_keys.to(at::kFloat).transpose(2, 3))
                            .mul_(scale)
                            .view({batch, kv_heads, blocks, rows, context});
  const auto hidden = at::arange(context, context_length.options())
                          .view({1, 1, 1, 1, context})
                          .ge(context_length.view({batch, 1, blocks, 1, 1}));
  context_scores.masked_fill_(hidden, minus_inf);
  const auto own_keys = k.to(at::kFloat).permute({0, 3, 1, 2, 4});  // [B, kv, N, L, d]
  const auto own_values = v.to(at::kFloat).permute({0, 3, 1, 2, 4});
  auto own_scores = at::matmul(queries, own_keys.transpose(3, 4)).mul_(scale);  // [.., L·g, L]
  const auto token = at::arange(length, context_length.options());
  const auto later = token.view({1, length}).gt(token.repeat_interleave(group).view({rows, 1}));
  own_scores.masked_fill_(later, minus_inf);
  // Each token sees itself, so the joint maximum is finite.
  const auto top = at::maximum(context_scores.amax(-1), own_scores.amax(-1)).unsqueeze(-1);
  const auto context_weights = context_scores.sub_(top).exp_();
  const auto own_weights = own_scores.sub_(top).exp_();
  const auto total = (context_weights.sum(-1) + own_weights.sum(-1)).unsqueeze(-1);
  const auto mixed = at::matmul(context_weights.view({batch, kv_heads, blocks * rows, context}),
                                context_values.to(at::kFloat))
                         .view({batch, kv_heads, blocks, rows, dim})
                         .add_(at::matmul(own_weights, own_values))
                         .div_(total);
  return mixed.view({batch, kv_heads, blocks, length, group, dim})
      .permute({0, 2, 3, 1, 4, 5})
      .reshape({batch, blocks, length, heads * dim})
      .to(q.scalar_type());
}

}  // namespace

Qwen3Model::Outputs Qwen3Model::run(const at::Tensor& input_ids, KvCache* cache,
                                    const std::vector<int64_t>& layer_ids,
                                    const core::RowSpans* spans) const {
  for (int64_t id : layer_ids) {
    if (id < 0 || id >= dims_.num_hidden_layers) {
      fail("Qwen3 model: layer id {} is outside the model's decoder layers [0, {})", id,
           dims_.num_hidden_layers);
    }
  }
  const int64_t batch = input_ids.size(0), count = input_ids.size(1);
  if (spans != nullptr && spans->positions.sizes() != at::IntArrayRef({batch, count})) {
    fail("Qwen3 model: row spans of [{}] positions for ids of [{}]",
         fmt::join(spans->positions.sizes(), ", "), fmt::join(input_ids.sizes(), ", "));
  }
  // The positions attention reads.
  const int64_t reach =
      spans != nullptr ? spans->keys : (cache != nullptr ? cache->length : 0) + count;
  if (cache != nullptr) {
    if (cache->keys.size() != layers_.size() || cache->keys[0].size(0) != batch ||
        reach > cache->keys[0].size(2)) {
      fail(
          "Qwen3 model: {} ids of batch {} do not fit the KV cache (batch {}, positions up to {} "
          "of {})",
          count, batch, cache->keys.empty() ? 0 : cache->keys[0].size(0), reach,
          cache->keys.empty() ? 0 : cache->keys[0].size(2));
    }
  }
  at::NoGradGuard no_grad;
  Positions positions = spans != nullptr ? make_row_positions(*spans, *cache)
                                         : make_positions(reach - count, count, inv_freq_,
                                                          dims_.rope, embed_tokens_.options());
  if (fused_ && spans == nullptr) {  // the q/k kernel takes a table per row (shared here)
    positions.batch_cos = positions.cos.unsqueeze(0).expand({batch, count, -1}).contiguous();
    positions.batch_sin = positions.sin.unsqueeze(0).expand({batch, count, -1}).contiguous();
  }
  auto x = at::embedding(embed_tokens_, input_ids.to(embed_tokens_.device()));
  std::vector<at::Tensor> captured(layer_ids.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    x = layer_forward(layers_[l], dims_, x, positions, cache, l, fused_);
    for (size_t i = 0; i < layer_ids.size(); ++i) {
      if (layer_ids[i] == static_cast<int64_t>(l)) captured[i] = x;
    }
  }
  if (cache != nullptr && spans == nullptr) cache->length += count;
  Outputs out;
  if (!captured.empty()) out.hidden_states = at::cat(captured, -1);
  out.last_hidden_state = rms_norm(x, final_norm_, dims_.rms_norm_eps, fused_);
  return out;
}

Qwen3Model::Outputs Qwen3Model::forward(const at::Tensor& input_ids,
                                        const std::vector<int64_t>& layer_ids) const {
  check_input_ids(input_ids, dims_.vocab_size);
  return run(input_ids, nullptr, layer_ids);
}

Qwen3Model::Outputs Qwen3Model::step(const at::Tensor& input_ids, KvCache& cache,
                                     const std::vector<int64_t>& layer_ids) const {
  check_input_ids(input_ids, dims_.vocab_size);
  return run(input_ids, &cache, layer_ids);
}

Qwen3Model::Outputs Qwen3Model::step_rows(const at::Tensor& input_ids, KvCache& cache,
                                          const std::vector<int64_t>& row_lengths,
                                          const std::vector<int64_t>& layer_ids) const {
  check_input_ids(input_ids, dims_.vocab_size);
  if (row_lengths.empty() || static_cast<int64_t>(row_lengths.size()) != input_ids.size(0)) {
    fail("Qwen3 model: {} row lengths for a batch of {}", row_lengths.size(), input_ids.size(0));
  }
  if (*std::min_element(row_lengths.begin(), row_lengths.end()) < 0) {
    fail("Qwen3 model: a row length is negative");
  }
  const auto spans = core::row_spans(row_lengths, input_ids.size(1), embed_tokens_.device(),
                                     embed_tokens_.scalar_type());
  return run(input_ids, &cache, layer_ids, &spans);
}

Qwen3Model::Outputs Qwen3Model::step_rows(const at::Tensor& input_ids, KvCache& cache,
                                          const core::RowSpans& spans,
                                          const std::vector<int64_t>& layer_ids) const {
  return run(input_ids, &cache, layer_ids, &spans);
}

at::Tensor Qwen3Model::branch(const at::Tensor& ids, const at::Tensor& context_length,
                              const KvCache& context) const {
  if (ids.dim() != 3 || ids.scalar_type() != at::kLong || ids.size(2) < 1) {
    fail("Qwen3 model: branch ids must be [B, N, L] int64 with L >= 1, got [{}] {}",
         fmt::join(ids.sizes(), ", "), c10::toString(ids.scalar_type()));
  }
  const int64_t batch = ids.size(0), blocks = ids.size(1), length = ids.size(2);
  if (context.keys.size() != layers_.size() || context.keys[0].size(0) != batch) {
    fail("Qwen3 model: branch ids of batch {} do not match the KV cache", batch);
  }
  if (context_length.sizes() != at::IntArrayRef({batch, blocks}) ||
      context_length.scalar_type() != at::kLong) {
    fail("Qwen3 model: branch context lengths must be [{}, {}] int64, got [{}] {}", batch, blocks,
         fmt::join(context_length.sizes(), ", "), c10::toString(context_length.scalar_type()));
  }
  if (context_length.numel() > 0 && (context_length.min().item<int64_t>() < 1 ||
                                     context_length.max().item<int64_t>() > context.length)) {
    fail("Qwen3 model: branch context lengths outside [1, {}] (the cached positions)",
         context.length);
  }
  check_input_ids(ids.view({batch * blocks, length}), dims_.vocab_size);
  at::NoGradGuard no_grad;
  const auto device = embed_tokens_.device();
  const auto lengths = context_length.to(device);
  const auto position =
      (lengths.unsqueeze(-1) + at::arange(length, lengths.options())).to(at::kFloat);  // [B, N, L]
  auto [cos, sin] = rope_tables(position, inv_freq_, dims_.rope, embed_tokens_.scalar_type());
  cos = cos.unsqueeze(3);  // [B, N, L, 1, d]: one table for every head
  sin = sin.unsqueeze(3);
  const int64_t dim = dims_.head_dim, heads = dims_.num_attention_heads;
  const int64_t kv_heads = dims_.num_key_value_heads;
  const double eps = dims_.rms_norm_eps;
  auto x = at::embedding(embed_tokens_, ids.to(device));  // [B, N, L, H]
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    const auto h = rms_norm(x, layer.input_layernorm, eps, fused_);
    auto q = rms_norm(at::linear(h, layer.q_proj).view({batch, blocks, length, heads, dim}),
                      layer.q_norm, eps);
    auto k = rms_norm(at::linear(h, layer.k_proj).view({batch, blocks, length, kv_heads, dim}),
                      layer.k_norm, eps);
    const auto v = at::linear(h, layer.v_proj).view({batch, blocks, length, kv_heads, dim});
    const auto attn = branch_attention(rotate(q, cos, sin), rotate(k, cos, sin), v,
                                       context.keys[l].narrow(2, 0, context.length),
                                       context.values[l].narrow(2, 0, context.length), lengths);
    x = mlp_residual(layer, dims_, x, at::linear(attn, layer.o_proj), fused_);
  }
  return rms_norm(x, final_norm_, eps, fused_);
}

at::Tensor Qwen3Model::logits(const at::Tensor& last_hidden_state) const {
  if (last_hidden_state.dim() < 1 || last_hidden_state.size(-1) != dims_.hidden_size) {
    fail("Qwen3 model: logits need states [..., {}], got [{}]", dims_.hidden_size,
         fmt::join(last_hidden_state.sizes(), ", "));
  }
  at::NoGradGuard no_grad;
  return at::linear(last_hidden_state.to(lm_head_.device(), lm_head_.scalar_type()), lm_head_);
}

}  // namespace dspine::target
