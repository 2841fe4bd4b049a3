// AdjacentInjection (docs/model.md, "Adjacent injection and the transfer space"): after every
// decoder layer each proposal slot receives a gated low-rank message computed from its predecessor
// (previous slot's feature, or the anchor token's transfer code for the first proposal), in the
// rank-r transfer space.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <vector>

namespace dspine::model {

class AdjacentInjectionImpl : public torch::nn::Module {
 public:
  // Registration order (state-dict keys): bias, readouts.{i}, writes.{i}, message,
  // receiver_gate, predecessor_gate. writes, predecessor_gate and bias start at zero so every
  // write is the identity at init; message/receiver_gate/readouts keep the default Linear init.
  // `fused`: the feature normalisation, the receiver/predecessor rows and the residual write run
  // as fused CUDA kernels (docs/kernels.md, "Injection pairs", "Injection residual"), same
  // parameters and function.
  AdjacentInjectionImpl(int64_t hidden_size, int64_t transfer_rank, int64_t message_size,
                        int64_t num_layers, int64_t replacement_layers, bool fused = false);

  // sqrt(r) * normalize(fp32(readouts[layer](h))), returned in h's dtype: [..., r].
  torch::Tensor feature(const torch::Tensor& h, int64_t layer);

  // h + rms(h) * delta(receiver, pred, layer), rms(h) = ‖h‖ / √H.
  torch::Tensor write(const torch::Tensor& h, const torch::Tensor& receiver,
                      const torch::Tensor& pred, int64_t layer);

  // writes[layer](messages(receiver, pred)).
  torch::Tensor delta(const torch::Tensor& receiver, const torch::Tensor& pred, int64_t layer);

  // sigmoid(receiver_gate(receiver) + predecessor_gate(pred) + bias) * message(pred), pred cast
  // to receiver's dtype first: [..., m].
  torch::Tensor messages(const torch::Tensor& receiver, const torch::Tensor& pred);

  struct Output {
    torch::Tensor out;      // the written state [B, N, bs, H]
    torch::Tensor feature;  // feature(out, layer) when asked for, else undefined
  };

  // h [B, N, bs, H] pre-injection state of `layer`; token_ids [B, N, bs] (slot 0 = anchor);
  // codes [V, r]; replace [B, N] bool or undefined. Slot 0 is never written. Blocks with
  // replace = true use the true tokens' codes as predecessors when layer < replacement_layers.
  // With `with_feature`, also the written state's feature; fused, its readout is readout(h) plus
  // rms(h) times the messages through readouts[layer]·writes[layer] ([r, m]), not a product
  // over H (docs/model.md, "Adjacent injection and the transfer space").
  Output forward(const torch::Tensor& h, int64_t layer, const torch::Tensor& token_ids,
                 const torch::Tensor& codes, const torch::Tensor& replace,
                 bool with_feature = false);

  // sqrt(r) * codes[ids]: [..., r] in the codes' dtype.
  torch::Tensor scaled_codes(const torch::Tensor& codes, const torch::Tensor& ids) const;

  torch::Tensor bias;
  torch::nn::ModuleList readouts{nullptr}, writes{nullptr};
  std::vector<torch::nn::Linear> readout_layers, write_layers;
  torch::nn::Linear message{nullptr}, receiver_gate{nullptr}, predecessor_gate{nullptr};

 private:
  // h + rms(h) · delta; with skip_first, slot 0 of every block is kept and delta covers slots 1..
  torch::Tensor residual(const torch::Tensor& h, const torch::Tensor& delta, bool skip_first);
  // sqrt(r) * normalize(readout) in the readout's dtype.
  torch::Tensor normalize(const torch::Tensor& readout);
  // The written state and its feature from readout = readouts[layer](h), with the readout of
  // the write taken through the messages (fused path of `forward`).
  Output write_with_feature(const torch::Tensor& h, const torch::Tensor& readout,
                            const torch::Tensor& messages, int64_t layer);

  int64_t hidden_size_, rank_, replacement_layers_;
  bool fused_;
  torch::Tensor unit_weight_;  // ones [r] for the fused feature norm; not a parameter or buffer
};
TORCH_MODULE(AdjacentInjection);

}  // namespace dspine::model
