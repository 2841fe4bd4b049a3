#include "model/draft_decoding.h"

#include <torch/torch.h>

#include <cmath>

#include "core/error.h"
#include "core/row_spans.h"
#include "model/attention.h"
#include "model/feature_norm.h"
#include "model/rope.h"
#include "ops/injection_gate_ops.h"
#include "ops/swiglu_ops.h"

namespace dspine::model {

DraftDecodingCache::DraftDecodingCache(DSpineDraftImpl& draft, int64_t batch, int64_t capacity)
    : draft_(draft) {
  if (!draft.transfer_ready()) {
    fail("Initialize or load the DSpine transfer space before use (transfer_ready is false)");
  }
  torch::NoGradGuard no_grad;
  const auto& c = draft.config();
  const auto options = draft.fc->weight.options();
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    // Zeros, not garbage: attention multiplies masked keys by zero weights, and NaN · 0 is NaN.
    keys_.push_back(torch::zeros({batch, c.num_key_value_heads, capacity, c.head_dim}, options));
    values_.push_back(torch::zeros_like(keys_.back()));
  }
  // The tables of training's RoPE (model/rope.h) at every position: a round gathers its rows'.
  const auto tables = rope_tables(
      torch::arange(capacity, options.dtype(torch::kLong)).view({1, -1}),
      rope_inv_freq(c.head_dim, c.rope_theta).to(options.device()), options.dtype().toScalarType());
  rope_cos_ = tables.cos.view({capacity, c.head_dim});
  rope_sin_ = tables.sin.view({capacity, c.head_dim});
  refresh_weights();
}

void DraftDecodingCache::refresh_weights() {
  torch::NoGradGuard no_grad;
  const auto pack = [](at::Tensor& packed, const std::vector<at::Tensor>& parts) {
    auto fresh = torch::cat(parts, 0);
    if (packed.defined()) {
      packed.copy_(fresh);
    } else {
      packed = std::move(fresh);
    }
  };
  const size_t layers = draft_.layer_modules.size();
  qkv_.resize(layers);
  gate_up_.resize(layers);
  injection_in_.resize(layers);
  const auto& injection = *draft_.injection;
  const auto dtype = draft_.fc->weight.scalar_type();
  // The gates and the message act on the normalised readout, a readout row times one number, so
  // they are applied to the readout weights here (products in fp32, rounded once).
  const auto gates_and_message =
      torch::cat({injection.receiver_gate->weight, injection.predecessor_gate->weight,
                  injection.message->weight})
          .to(torch::kFloat);
  std::vector<at::Tensor> context_kv;
  for (size_t i = 0; i < layers; ++i) {
    const auto& attention = *draft_.layer_modules[i]->self_attn;
    const auto& mlp = *draft_.layer_modules[i]->mlp;
    pack(qkv_[i], {attention.q_proj->weight, attention.k_proj->weight, attention.v_proj->weight});
    pack(gate_up_[i], {mlp.gate_proj->weight, mlp.up_proj->weight});
    const auto& readout = injection.readout_layers[i]->weight;
    pack(injection_in_[i],
         {readout, torch::matmul(gates_and_message, readout.to(torch::kFloat)).to(dtype)});
    context_kv.push_back(attention.k_proj->weight);
    context_kv.push_back(attention.v_proj->weight);
  }
  pack(context_kv_, context_kv);
  // The first proposal's predecessor is the anchor token's scaled transfer code
  // (AdjacentInjectionImpl::scaled_codes, cast as the forward casts it): its gate and message
  // terms for every token.
  const double scale = std::sqrt(static_cast<double>(draft_.config().dspine.transfer_rank));
  const auto codes = (scale * draft_.transfer_codes).to(dtype).to(torch::kFloat);
  pack(anchor_terms_, {torch::matmul(codes, torch::cat({injection.predecessor_gate->weight,
                                                        injection.message->weight})
                                                .to(torch::kFloat)
                                                .t())
                           .to(dtype)});
}

const RopeTables& DraftDecodingCache::rope_at(const core::RowSpans& spans) {
  if (!rope_positions_.is_same(spans.positions)) {
    rope_ = {core::rows_at(rope_cos_, spans.positions), core::rows_at(rope_sin_, spans.positions)};
    rope_positions_ = spans.positions;
  }
  return rope_;
}

void DraftDecodingCache::extend(const at::Tensor& target_hidden,
                                const std::vector<int64_t>& starts) {
  extend(target_hidden, core::row_spans(starts, target_hidden.size(1), draft_.fc->weight.device(),
                                        draft_.fc->weight.scalar_type()));
}

void DraftDecodingCache::extend(const at::Tensor& target_hidden, const core::RowSpans& spans) {
  torch::NoGradGuard no_grad;
  if (spans.keys > capacity()) {
    fail("draft cache: positions up to {} asked of a cache of {}", spans.keys, capacity());
  }
  const auto& c = draft_.config();
  const auto options = draft_.fc->weight.options();
  const int64_t rows = target_hidden.size(0), count = target_hidden.size(1);
  // The projection itself, not DSpineDraftImpl::context: that announces the "context" unit to
  // the draft's observer, which under zero3 gathers it collectively, and ranks decode different
  // numbers of rounds. Decoding runs on whole weights and announces no unit (nor do its layers).
  const auto context =
      draft_.hidden_norm(draft_.fc(target_hidden.to(options.device(), options.dtype())));
  const RopeTables& rope = rope_at(spans);
  const auto kv = torch::nn::functional::linear(context, context_kv_);  // every layer's k and v
  const int64_t width = c.num_key_value_heads * c.head_dim;
  const std::vector<int64_t> shape{rows, count, c.num_key_value_heads, c.head_dim};
  for (size_t i = 0; i < keys_.size(); ++i) {
    const int64_t at = 2 * static_cast<int64_t>(i) * width;
    const auto k = norm_then_rope(draft_.layer_modules[i]->self_attn->k_norm,
                                  kv.narrow(-1, at, width).view(shape), rope);
    core::write_spans(keys_[i].transpose(1, 2), k, spans);
    core::write_spans(values_[i].transpose(1, 2), kv.narrow(-1, at + width, width).view(shape),
                      spans);
  }
}

DraftOutput DraftDecodingCache::block(const std::vector<int64_t>& anchors,
                                      const at::Tensor& block_ids, const at::Tensor& noise) {
  return block(
      core::row_spans(anchors, draft_.config().block_size, noise.device(), noise.scalar_type()),
      block_ids, noise);
}

DraftOutput DraftDecodingCache::block(const core::RowSpans& spans, const at::Tensor& block_ids,
                                      const at::Tensor& noise, bool keep_pre_injection) {
  torch::NoGradGuard no_grad;
  const int64_t rows = noise.size(0), bs = draft_.config().block_size;
  const int64_t hidden = draft_.config().hidden_size;
  if (spans.keys > capacity()) {
    fail("draft cache: a block up to position {} asked of a cache of {}", spans.keys, capacity());
  }
  const RopeTables& rope = rope_at(spans);
  const auto bias = spans.bias.to(noise.scalar_type());  // the same tensor when the dtypes agree
  const auto anchor_ids = block_ids.select(1, 0);
  auto x = noise;
  at::Tensor pre;
  for (size_t i = 0; i < keys_.size(); ++i) {
    x = layer(i, x, spans, rope, bias);  // a fresh tensor, which the injection writes into
    if (keep_pre_injection && i + 1 == keys_.size()) pre = x.clone().view({rows, 1, bs, hidden});
    inject(i, x, anchor_ids);
  }
  return {draft_.norm(x).view({rows, 1, bs, hidden}), pre, at::Tensor()};
}

// DecoderLayerImpl::forward for the block against the layer's cache: its keys and values are
// written at the spans, and each query sees the cached keys the spans make visible.
at::Tensor DraftDecodingCache::layer(size_t index, const at::Tensor& x, const core::RowSpans& spans,
                                     const RopeTables& rope, const at::Tensor& bias) {
  auto& layer = *draft_.layer_modules[index];
  auto& attention = *layer.self_attn;
  const auto& c = draft_.config();
  const int64_t rows = x.size(0), count = x.size(1), dim = c.head_dim;
  const int64_t heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;
  const auto qkv = torch::nn::functional::linear(layer.input_layernorm(x), qkv_[index]);
  const int64_t q_width = heads * dim, kv_width = kv_heads * dim;
  const auto q = norm_then_rope(attention.q_norm,
                                qkv.narrow(-1, 0, q_width).view({rows, count, heads, dim}), rope);
  const auto k = norm_then_rope(
      attention.k_norm, qkv.narrow(-1, q_width, kv_width).view({rows, count, kv_heads, dim}), rope);
  const auto v = qkv.narrow(-1, q_width + kv_width, kv_width).view({rows, count, kv_heads, dim});
  core::write_spans(keys_[index].transpose(1, 2), k, spans);
  core::write_spans(values_[index].transpose(1, 2), v, spans);
  const auto attended = at::scaled_dot_product_attention(
      q.transpose(1, 2), keys_[index].narrow(2, 0, spans.keys),
      values_[index].narrow(2, 0, spans.keys), bias, 0.0, false,
      1.0 / std::sqrt(static_cast<double>(dim)), /*enable_gqa=*/true);
  const auto projected = torch::nn::functional::linear(
      attended.transpose(1, 2).reshape({rows, count, q_width}), attention.o_proj->weight);
  auto [out, normed] = layer.post_attention_layernorm->forward_add(projected, x);
  // The MLP, its residual added by the down projection's GEMM (no gradient is taken).
  return ops::swiglu_mlp_add_(out, normed, gate_up_[index], layer.mlp->down_proj->weight,
                              layer.mlp->fused);
}

// AdjacentInjectionImpl::forward of one layer, no replacement and no feature: one GEMM reads the
// state's readout and its three terms, one kernel makes the gated messages scaled by rms(h), and
// the write's GEMM adds them into h (slot 0's message is zero, so the anchor's state stays).
void DraftDecodingCache::inject(size_t index, const at::Tensor& h, const at::Tensor& anchor_ids) {
  auto& injection = *draft_.injection;
  const int64_t rank = draft_.config().dspine.transfer_rank;
  const int64_t hidden = h.size(-1), size = injection.message->weight.size(0);
  const auto terms = torch::nn::functional::linear(h, injection_in_[index]);  // [B, bs, r + 3m]
  const double eps = feature_norm_eps(rank);  // as the training module's fused feature norm
  const auto messages =
      draft_.norm->fused &&
              ops::injection_gate_fusable(terms, h, anchor_terms_, anchor_ids, injection.bias, rank)
          ? ops::injection_gate_fused(terms, h, anchor_terms_, anchor_ids, injection.bias, rank,
                                      eps)
          : ops::injection_gate_reference(terms, h, anchor_terms_, anchor_ids, injection.bias, rank,
                                          eps);
  h.view({-1, hidden})
      .addmm_(messages.view({-1, size}), injection.write_layers.at(index)->weight.t());
}

}  // namespace dspine::model
