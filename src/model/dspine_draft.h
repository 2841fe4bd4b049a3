// The DSpine draft model (docs/model.md, "Backbone layers", "State-dict keys"): context projection
// of the K target layers, L decoder layers over [context | block tokens] with an AdjacentInjection
// after each, the final norm, the refinement head, and the fixed transfer space (buffers
// `transfer_codes` [V, r] fp32 and `transfer_ready` 0-d bool). named_parameters()/named_buffers()
// are the reference state-dict keys.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <vector>

#include "core/config.h"
#include "model/adjacent_injection.h"
#include "model/decoder_layer.h"
#include "model/dspine_config.h"
#include "model/norm_mlp.h"
#include "model/unit_observer.h"

namespace dspine::model {

struct DraftOutput {
  at::Tensor hidden_states;   // [B, N, bs, H] final, normed
  at::Tensor pre_injection;   // [B, N, bs, H] last layer's decoder output before injection
  at::Tensor layer_features;  // [L, B, N, bs, r] post-injection features of every layer, or
                              // undefined when forward was not asked for them
};

// Units announced to a UnitObserver: "context" (fc, hidden_norm), "layers.<i>", and "head"
// (norm, injection), which every layer and the refinement use until the step ends.
class DSpineDraftImpl : public torch::nn::Module, public ObservableUnits {
 public:
  // Validates the config, builds the modules in reference order and initializes them: backbone
  // Linear weights N(0, initializer_range), norms 1 (global torch RNG); injection per §3.1;
  // transfer_codes zero and transfer_ready false until initialize_transfer_space().
  DSpineDraftImpl(const DSpineModelConfig& config, bool fused);

  // position_ids [B, S+Q]; anchors [B, N] int64 and keep [B, N] bool (the blocks, which define
  // the attention mask: block_attention_mask); noise_embedding [B, Q, H]; target_hidden
  // [B, S, K*H]; block_token_ids [B, N, bs]; replace_mask [B, N] bool or undefined. Attention runs
  // through the block kernels where block_kernels_apply, else through the dense mask.
  // layer_features: whether to compute the alignment term's per-layer features (a readout GEMM
  // and a norm per layer that nothing else reads; the CE-only prepass goes without).
  DraftOutput forward(const torch::Tensor& position_ids, const torch::Tensor& anchors,
                      const torch::Tensor& keep, const torch::Tensor& noise_embedding,
                      const torch::Tensor& target_hidden, const torch::Tensor& block_token_ids,
                      const torch::Tensor& replace_mask, bool layer_features = true);

  // hidden_norm(fc(target_hidden)): [B, S, H].
  torch::Tensor context(const torch::Tensor& target_hidden);

  // norm(write(h, feature(h, L-1), sqrt(r) * codes[pred_ids], L-1)) (docs/model.md, "Refinement
  // head").
  torch::Tensor refine(const torch::Tensor& h, const torch::Tensor& pred_ids);

  // Sets the codes and every readout from the frozen head [V, H] (docs/model.md, "Adjacent
  // injection and the transfer space") and marks the space ready. Call once on a fresh draft; a
  // loaded checkpoint carries its buffers instead.
  void initialize_transfer_space(const torch::Tensor& head, int64_t chunk_size = 4096);
  // Whether the transfer space was built or loaded. The flag lives with the buffers (on the
  // draft's device) and is read only until it is seen true, so that a forward does not wait for
  // the GPU to check it; nothing clears it (the loaders refuse a draft without it).
  bool transfer_ready() const;

  const DSpineModelConfig& config() const { return config_; }
  void set_unit_observer(std::shared_ptr<UnitObserver> observer) override;

  torch::nn::ModuleList layers{nullptr};
  std::vector<DecoderLayer> layer_modules;
  RMSNorm norm{nullptr};
  torch::nn::Linear fc{nullptr};
  RMSNorm hidden_norm{nullptr};
  AdjacentInjection injection{nullptr};
  torch::Tensor transfer_codes;
  torch::Tensor transfer_ready_flag;  // registered as "transfer_ready"

 private:
  void enter(const std::string& unit);
  torch::Tensor leave(const std::string& unit, const torch::Tensor& output);

  DSpineModelConfig config_;
  bool fused_;
  torch::Tensor inv_freq_;  // non-persistent rotary_emb.inv_freq
  std::shared_ptr<UnitObserver> observer_;
  mutable bool transfer_seen_ready_ = false;  // transfer_ready's last read was true
};
TORCH_MODULE(DSpineDraft);

// Moves parameters to (device, dtype) and buffers to device only: transfer_codes stay fp32 and
// transfer_ready stays bool (torch::nn::Module::to(dtype) would cast every buffer).
void place_draft(DSpineDraftImpl& draft, const torch::Device& device, torch::Dtype dtype);

// A draft built on CPU fp32 from the global torch RNG, with the kernels model.fused_kernels picks
// for `device`, then placed there.
DSpineDraft build_placed_draft(const DSpineModelConfig& config, const torch::Device& device,
                               torch::Dtype dtype);

}  // namespace dspine::model
