#include "model/draft_decoding.h"

#include <torch/torch.h>

#include "core/error.h"
#include "core/row_spans.h"
#include "model/rope.h"

namespace dspine::model {

DraftDecodingCache::DraftDecodingCache(DSpineDraftImpl& draft, int64_t batch, int64_t capacity)
    : draft_(draft) {
  if (!draft.transfer_ready()) {
    fail("Initialize or load the DSpine transfer space before use (transfer_ready is false)");
  }
  const auto& c = draft.config();
  const auto options = draft.fc->weight.options();
  inv_freq_ = rope_inv_freq(c.head_dim, c.rope_theta).to(options.device());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    // Zeros, not garbage: attention multiplies masked keys by zero weights, and NaN · 0 is NaN.
    keys_.push_back(torch::zeros({batch, c.num_key_value_heads, capacity, c.head_dim}, options));
    values_.push_back(torch::zeros_like(keys_.back()));
  }
}

void DraftDecodingCache::extend(const at::Tensor& target_hidden,
                                const std::vector<int64_t>& starts) {
  const auto spans = core::row_spans(starts, target_hidden.size(1), draft_.fc->weight.device());
  write_context(target_hidden, spans);
}

void DraftDecodingCache::extend(const at::Tensor& target_hidden, const at::Tensor& starts,
                                int64_t keys) {
  write_context(target_hidden, core::row_spans(starts, target_hidden.size(1), keys));
}

void DraftDecodingCache::write_context(const at::Tensor& target_hidden,
                                       const core::RowSpans& spans) {
  torch::NoGradGuard no_grad;
  if (spans.keys > keys_[0].size(2)) {
    fail("draft cache: positions up to {} asked of a cache of {}", spans.keys, keys_[0].size(2));
  }
  const auto options = draft_.fc->weight.options();
  // The projection itself, not DSpineDraftImpl::context: that announces the "context" unit to
  // the draft's observer, which under zero3 gathers it collectively, and ranks decode different
  // numbers of rounds. Decoding runs on whole weights and announces no unit (nor do its layers).
  const auto context =
      draft_.hidden_norm(draft_.fc(target_hidden.to(options.device(), options.dtype())));
  const auto rope = rope_tables(spans.positions, inv_freq_, context.scalar_type());
  for (size_t i = 0; i < keys_.size(); ++i) {
    auto [k, v] = draft_.layer_modules[i]->self_attn->context_kv(context, rope);
    core::write_spans(keys_[i].transpose(1, 2), k, spans);
    core::write_spans(values_[i].transpose(1, 2), v, spans);
  }
}

DraftOutput DraftDecodingCache::block(const std::vector<int64_t>& anchors,
                                      const at::Tensor& block_ids, const at::Tensor& noise) {
  return run_block(core::row_spans(anchors, draft_.config().block_size, noise.device()), block_ids,
                   noise);
}

DraftOutput DraftDecodingCache::block(const at::Tensor& anchors, int64_t keys,
                                      const at::Tensor& block_ids, const at::Tensor& noise) {
  return run_block(core::row_spans(anchors, draft_.config().block_size, keys), block_ids, noise);
}

DraftOutput DraftDecodingCache::run_block(const core::RowSpans& spans, const at::Tensor& block_ids,
                                          const at::Tensor& noise) {
  torch::NoGradGuard no_grad;
  const int64_t rows = noise.size(0), bs = draft_.config().block_size;
  const int64_t hidden = draft_.config().hidden_size;
  if (spans.keys > keys_[0].size(2)) {
    fail("draft cache: a block up to position {} asked of a cache of {}", spans.keys,
         keys_[0].size(2));
  }
  const auto rope = rope_tables(spans.positions, inv_freq_, noise.scalar_type());
  const auto token_blocks = block_ids.view({rows, 1, bs});
  auto x = noise;
  at::Tensor pre;
  for (size_t i = 0; i < keys_.size(); ++i) {
    x = draft_.layer_modules[i]->forward_cached(x, keys_[i], values_[i], spans, rope);
    pre = x.view({rows, 1, bs, hidden});
    auto injected = draft_.injection->forward(pre, static_cast<int64_t>(i), token_blocks,
                                              draft_.transfer_codes, at::Tensor(),
                                              /*layer_features=*/false);
    x = injected.out.view({rows, bs, hidden});
  }
  return {draft_.norm(x).view({rows, 1, bs, hidden}), pre, at::Tensor()};
}

}  // namespace dspine::model
