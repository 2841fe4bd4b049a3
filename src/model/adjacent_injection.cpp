#include "model/adjacent_injection.h"

#include <torch/torch.h>

#include <cmath>

#include "model/feature_norm.h"
#include "ops/injection_pairs_ops.h"
#include "ops/injection_residual_ops.h"
#include "ops/rms_norm_ops.h"

namespace dspine::model {

namespace {
torch::nn::Linear linear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}
}  // namespace

AdjacentInjectionImpl::AdjacentInjectionImpl(int64_t hidden_size, int64_t transfer_rank,
                                             int64_t message_size, int64_t num_layers,
                                             int64_t replacement_layers, bool fused)
    : hidden_size_(hidden_size),
      rank_(transfer_rank),
      replacement_layers_(replacement_layers),
      fused_(fused) {
  bias = register_parameter("bias", torch::zeros({message_size}));
  readouts = register_module("readouts", torch::nn::ModuleList());
  writes = register_module("writes", torch::nn::ModuleList());
  for (int64_t i = 0; i < num_layers; ++i) {
    readout_layers.push_back(linear(hidden_size, transfer_rank));
    readouts->push_back(readout_layers.back());
  }
  for (int64_t i = 0; i < num_layers; ++i) {
    write_layers.push_back(linear(message_size, hidden_size));
    writes->push_back(write_layers.back());
  }
  message = register_module("message", linear(transfer_rank, message_size));
  receiver_gate = register_module("receiver_gate", linear(transfer_rank, message_size));
  predecessor_gate = register_module("predecessor_gate", linear(transfer_rank, message_size));
  torch::NoGradGuard no_grad;
  for (auto& w : write_layers) w->weight.zero_();
  predecessor_gate->weight.zero_();
}

torch::Tensor AdjacentInjectionImpl::feature(const torch::Tensor& h, int64_t layer) {
  return normalize(readout_layers.at(layer)(h));
}

torch::Tensor AdjacentInjectionImpl::normalize(const torch::Tensor& readout) {
  if (fused_ && readout.is_cuda()) {
    // sqrt(r) · p / ‖p‖ is RMSNorm with unit weight: one kernel each way.
    if (!unit_weight_.defined() || unit_weight_.device() != readout.device() ||
        unit_weight_.scalar_type() != readout.scalar_type()) {
      unit_weight_ = torch::ones({rank_}, readout.options());
    }
    const double eps = feature_norm_eps(rank_);
    if (ops::rms_norm_fusable(readout, unit_weight_)) {
      return ops::rms_norm_fused(readout, unit_weight_, eps);
    }
  }
  auto p = readout.to(torch::kFloat32);
  auto unit = p / p.norm(2, -1, true).clamp_min(kFeatureZeroNorm);
  return (std::sqrt(static_cast<double>(rank_)) * unit).to(readout.scalar_type());
}

torch::Tensor AdjacentInjectionImpl::messages(const torch::Tensor& receiver,
                                              const torch::Tensor& pred) {
  auto p = pred.to(receiver.scalar_type());
  auto gate = torch::sigmoid(receiver_gate(receiver) + predecessor_gate(p) + bias);
  return gate * message(p);
}

torch::Tensor AdjacentInjectionImpl::delta(const torch::Tensor& receiver, const torch::Tensor& pred,
                                           int64_t layer) {
  return write_layers.at(layer)(messages(receiver, pred));
}

torch::Tensor AdjacentInjectionImpl::residual(const torch::Tensor& h, const torch::Tensor& delta,
                                              bool skip_first) {
  if (fused_ && ops::injection_residual_fusable(h, delta, skip_first)) {
    return ops::injection_residual_fused(h, delta, skip_first);
  }
  return ops::injection_residual_reference(h, delta, skip_first);
}

torch::Tensor AdjacentInjectionImpl::write(const torch::Tensor& h, const torch::Tensor& receiver,
                                           const torch::Tensor& pred, int64_t layer) {
  return residual(h, delta(receiver, pred, layer), /*skip_first=*/false);
}

torch::Tensor AdjacentInjectionImpl::scaled_codes(const torch::Tensor& codes,
                                                  const torch::Tensor& ids) const {
  return std::sqrt(static_cast<double>(rank_)) * torch::embedding(codes, ids);
}

AdjacentInjectionImpl::Output AdjacentInjectionImpl::write_with_feature(
    const torch::Tensor& h, const torch::Tensor& readout, const torch::Tensor& messages,
    int64_t layer) {
  auto delta = write_layers.at(layer)(messages);
  // readout(rms · delta) = rms · messages · (readout · write)ᵀ: a rank-m product instead of one
  // over H; the write's rms comes from the residual kernel (one node, one pass over h each way).
  auto through =
      torch::matmul(readout_layers.at(layer)->weight, write_layers.at(layer)->weight);  // [r, m]
  auto delta_readout = torch::nn::functional::linear(messages, through);
  auto [out, out_readout] =
      ops::injection_residual_readout_fusable(h, delta, readout, delta_readout, true)
          ? ops::injection_residual_readout_fused(h, delta, readout, delta_readout, true)
          : ops::injection_residual_readout_reference(h, delta, readout, delta_readout, true);
  return {out, normalize(out_readout)};
}

AdjacentInjectionImpl::Output AdjacentInjectionImpl::forward(const torch::Tensor& h, int64_t layer,
                                                             const torch::Tensor& token_ids,
                                                             const torch::Tensor& codes,
                                                             const torch::Tensor& replace,
                                                             bool with_feature) {
  const int64_t proposals = h.size(2) - 1;
  auto readout = readout_layers.at(layer)(h);
  auto features = normalize(readout);
  auto anchor = scaled_codes(codes, token_ids.slice(2, 0, 1)).to(features.scalar_type());
  // Proposal k receives at slot k + 1 and reads its predecessor at slot k (the anchor's code at 0).
  auto [receiver, pred] = fused_ && ops::injection_pairs_fusable(features, anchor)
                              ? ops::injection_pairs_fused(features, anchor)
                              : ops::injection_pairs_reference(features, anchor);  // [B, N, T-1, r]
  if (replace.defined() && layer < replacement_layers_) {
    auto truth = scaled_codes(codes, token_ids.slice(2, 0, proposals)).to(pred.scalar_type());
    pred = torch::where(replace.to(torch::kBool).view({replace.size(0), replace.size(1), 1, 1}),
                        truth, pred);
  }
  if (with_feature && fused_)
    return write_with_feature(h, readout, messages(receiver, pred), layer);
  auto out = residual(h, delta(receiver, pred, layer), /*skip_first=*/true);
  return {out, with_feature ? feature(out, layer) : torch::Tensor()};
}

}  // namespace dspine::model
