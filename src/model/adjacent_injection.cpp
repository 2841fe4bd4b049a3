#include "model/adjacent_injection.h"

#include <torch/torch.h>

#include <cmath>

namespace dspine::model {

namespace {
torch::nn::Linear linear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}
}  // namespace

AdjacentInjectionImpl::AdjacentInjectionImpl(int64_t hidden_size, int64_t transfer_rank,
                                             int64_t message_size, int64_t num_layers,
                                             int64_t replacement_layers)
    : hidden_size_(hidden_size), rank_(transfer_rank), replacement_layers_(replacement_layers) {
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
  auto p = readout_layers.at(layer)(h).to(torch::kFloat32);
  auto unit = p / p.norm(2, -1, true).clamp_min(1e-12);
  return (std::sqrt(static_cast<double>(rank_)) * unit).to(h.scalar_type());
}

torch::Tensor AdjacentInjectionImpl::write(const torch::Tensor& h, const torch::Tensor& receiver,
                                           const torch::Tensor& pred, int64_t layer) {
  auto p = pred.to(receiver.scalar_type());
  auto gate = torch::sigmoid(receiver_gate(receiver) + predecessor_gate(p) + bias);
  auto delta = write_layers.at(layer)(gate * message(p));
  // The norm accumulates in fp32 without an fp32 copy of h (which its backward would keep).
  auto rms = (at::linalg_vector_norm(h, 2, {-1}, true, torch::kFloat32) /
              std::sqrt(static_cast<double>(hidden_size_)))
                 .to(h.scalar_type());
  return h + rms * delta;
}

torch::Tensor AdjacentInjectionImpl::scaled_codes(const torch::Tensor& codes,
                                                  const torch::Tensor& ids) const {
  return std::sqrt(static_cast<double>(rank_)) * torch::embedding(codes, ids);
}

torch::Tensor AdjacentInjectionImpl::forward(const torch::Tensor& h, int64_t layer,
                                             const torch::Tensor& token_ids,
                                             const torch::Tensor& codes,
                                             const torch::Tensor& replace) {
  const int64_t proposals = h.size(2) - 1;
  auto features = feature(h, layer);
  auto anchor = scaled_codes(codes, token_ids.slice(2, 0, 1)).to(features.scalar_type());
  auto pred = torch::cat({anchor, features.slice(2, 1, proposals)}, 2);  // [B, N, T, r]
  if (replace.defined() && layer < replacement_layers_) {
    auto truth = scaled_codes(codes, token_ids.slice(2, 0, proposals)).to(pred.scalar_type());
    pred = torch::where(replace.to(torch::kBool).view({replace.size(0), replace.size(1), 1, 1}),
                        truth, pred);
  }
  auto written = write(h.slice(2, 1), features.slice(2, 1), pred, layer);
  return torch::cat({h.slice(2, 0, 1), written}, 2);
}

}  // namespace dspine::model
