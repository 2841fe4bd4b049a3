#include "model/dspine_draft.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <cmath>

#include "core/error.h"
#include "model/attention.h"
#include "model/block_mask.h"
#include "model/dspine_config.h"
#include "model/norm_mlp.h"
#include "model/rope.h"
#include "model/transfer_space.h"

namespace dspine::model {

DSpineDraftImpl::DSpineDraftImpl(const DSpineModelConfig& config, bool fused)
    : config_(config), fused_(fused) {
  validate_dspine_model_config(config);
  const int64_t hidden = config.hidden_size;
  const int64_t context_width = hidden * static_cast<int64_t>(config.target_layer_ids.size());
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    layer_modules.push_back(DecoderLayer(config, fused));
    layers->push_back(layer_modules.back());
  }
  norm = register_module("norm", RMSNorm(hidden, config.rms_norm_eps, fused));
  fc = register_module(
      "fc", torch::nn::Linear(torch::nn::LinearOptions(context_width, hidden).bias(false)));
  hidden_norm = register_module("hidden_norm", RMSNorm(hidden, config.rms_norm_eps, fused));
  {
    // HF Qwen3 rule for the backbone (§3.1): Linear weights normal, norm weights one. The
    // injection is created afterwards and keeps its own init.
    torch::NoGradGuard no_grad;
    for (auto& p : parameters()) {
      if (p.dim() == 2) {
        p.normal_(0.0, config.initializer_range);
      } else {
        p.fill_(1.0);
      }
    }
  }
  const auto& d = config.dspine;
  injection = register_module("injection",
                              AdjacentInjection(hidden, d.transfer_rank, d.message_size,
                                                config.num_hidden_layers, d.replacement_layers,
                                                fused));
  transfer_codes =
      register_buffer("transfer_codes", torch::zeros({config.vocab_size, d.transfer_rank}));
  transfer_ready_flag = register_buffer("transfer_ready", torch::zeros({}, torch::kBool));
  inv_freq_ = rope_inv_freq(config.head_dim, config.rope_theta);
}

bool DSpineDraftImpl::transfer_ready() const {
  if (!transfer_seen_ready_) transfer_seen_ready_ = transfer_ready_flag.item<bool>();
  return transfer_seen_ready_;
}

void DSpineDraftImpl::initialize_transfer_space(const torch::Tensor& head, int64_t chunk_size) {
  if (head.dim() != 2 || head.size(0) != config_.vocab_size ||
      head.size(1) != config_.hidden_size) {
    fail(
        "DSpine transfer space requires the target head's full vocabulary and hidden width: "
        "expected [{}, {}], got {}",
        config_.vocab_size, config_.hidden_size, c10::str(head.sizes()));
  }
  auto space = compute_transfer_space(head, config_.dspine.transfer_rank, chunk_size);
  torch::NoGradGuard no_grad;
  transfer_codes.copy_(space.codes);
  auto readout = space.basis.t();
  for (auto& r : injection->readout_layers) r->weight.copy_(readout);
  transfer_ready_flag.fill_(true);
}

void DSpineDraftImpl::set_unit_observer(std::shared_ptr<UnitObserver> observer) {
  observer_ = std::move(observer);
}

void DSpineDraftImpl::enter(const std::string& unit) {
  if (observer_) observer_->before_unit(unit);
}

torch::Tensor DSpineDraftImpl::leave(const std::string& unit, const torch::Tensor& output) {
  return observer_ ? observer_->after_unit(unit, output) : output;
}

torch::Tensor DSpineDraftImpl::context(const torch::Tensor& target_hidden) {
  enter("context");
  RECORD_USER_SCOPE("dspine.context");
  return leave("context", hidden_norm(fc(target_hidden)));
}

DraftOutput DSpineDraftImpl::forward(const torch::Tensor& position_ids,
                                     const torch::Tensor& anchors, const torch::Tensor& keep,
                                     const torch::Tensor& noise_embedding,
                                     const torch::Tensor& target_hidden,
                                     const torch::Tensor& block_token_ids,
                                     const torch::Tensor& replace_mask, bool layer_features) {
  if (!transfer_ready()) {
    fail("Initialize or load the DSpine transfer space before use (transfer_ready is false)");
  }
  if (!anchors.defined() || !keep.defined()) fail("DSpine requires the blocks' anchors and keep");
  const int64_t bs = config_.block_size;
  const int64_t rows = noise_embedding.size(0), queries = noise_embedding.size(1);
  if (block_token_ids.dim() != 3 || block_token_ids.size(2) != bs ||
      block_token_ids.size(0) != rows || block_token_ids.size(1) * bs != queries) {
    fail("DSpine token blocks and noise embeddings must match block_size {}: blocks {}, noise {}",
         bs, c10::str(block_token_ids.sizes()), c10::str(noise_embedding.sizes()));
  }
  const int64_t blocks = block_token_ids.size(1);
  const int64_t hidden = config_.hidden_size;

  auto x = noise_embedding;
  enter("head");
  auto ctx = context(target_hidden);
  auto rope = rope_tables(position_ids, inv_freq_, x.scalar_type());
  auto mask = block_kernels_apply(config_, fused_, x)
                  ? block_form_attention_mask(anchors, keep, bs)
                  : prepare_attention_mask(
                        block_attention_mask(anchors, keep, target_hidden.size(1), bs));
  std::vector<torch::Tensor> features;
  torch::Tensor pre;
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const std::string unit = "layers." + std::to_string(i);
    enter(unit);
    x = leave(unit, layer_modules[i](x, ctx, mask, rope));
    pre = x.view({rows, blocks, bs, hidden});
    RECORD_USER_SCOPE("dspine.injection");
    auto injected =
        injection->forward(pre, i, block_token_ids, transfer_codes, replace_mask, layer_features);
    if (layer_features) features.push_back(injected.feature);
    x = injected.out.view({rows, queries, hidden});
  }
  return {norm(x).view({rows, blocks, bs, hidden}), pre,
          layer_features ? torch::stack(features) : torch::Tensor()};
}

torch::Tensor DSpineDraftImpl::refine(const torch::Tensor& h, const torch::Tensor& pred_ids) {
  const int64_t last = config_.num_hidden_layers - 1;
  enter("head");
  RECORD_USER_SCOPE("dspine.refine");
  auto receiver = injection->feature(h, last);
  auto pred = injection->scaled_codes(transfer_codes, pred_ids);
  return norm(injection->write(h, receiver, pred, last));
}

void place_draft(DSpineDraftImpl& draft, const torch::Device& device, torch::Dtype dtype) {
  torch::NoGradGuard no_grad;
  for (auto& p : draft.parameters()) p.set_data(p.to(device, dtype));
  for (auto& b : draft.buffers()) b.set_data(b.to(device));
}

DSpineDraft build_placed_draft(const DSpineModelConfig& config, const torch::Device& device,
                               torch::Dtype dtype) {
  DSpineDraft draft(config, use_fused_kernels(config.fused_kernels, device));
  place_draft(*draft, device, dtype);
  return draft;
}

}  // namespace dspine::model
