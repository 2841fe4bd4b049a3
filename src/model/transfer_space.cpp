#include "model/transfer_space.h"

#include <cmath>

#include <torch/torch.h>

#include "core/error.h"

namespace dspine::model {

namespace {
torch::Tensor unit_rows(const torch::Tensor& x) { return x / x.norm(2, -1, true).clamp_min(1e-12); }

// Square roots rounded correctly on any processor. ATen's CPU sqrt runs MKL's vector math, whose
// rounding differs between processors (docs/kernels.md, "Optimizer step (AdamW)"); the CUDA sqrt
// and std::sqrt both round correctly, so either device gets these bits.
torch::Tensor correctly_rounded_sqrt(const torch::Tensor& values) {
  auto host = values.to(torch::kCPU, torch::kFloat32).contiguous().clone();
  float* data = host.data_ptr<float>();
  for (int64_t i = 0; i < host.numel(); ++i) data[i] = std::sqrt(data[i]);
  return host.to(values.device());
}
}  // namespace

TransferSpace compute_transfer_space(const at::Tensor& head, int64_t rank, int64_t chunk_size) {
  if (chunk_size < 1)
    fail("DSpine transfer space chunk_size must be positive (got {})", chunk_size);
  if (head.dim() != 2) fail("DSpine transfer space needs a [V, H] head, got {}D", head.dim());
  torch::NoGradGuard no_grad;
  const int64_t vocab = head.size(0), hidden = head.size(1);
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(head.device());
  auto total = torch::zeros({hidden}, f32);
  auto gram = torch::zeros({hidden, hidden}, f32);
  for (int64_t begin = 0; begin < vocab; begin += chunk_size) {
    auto rows = unit_rows(head.slice(0, begin, begin + chunk_size).to(torch::kFloat32));
    total += rows.sum(0);
    gram += rows.t().matmul(rows);
  }
  auto mean = total / static_cast<double>(vocab);
  auto scatter = gram - static_cast<double>(vocab) * torch::outer(mean, mean);
  auto [values, vectors] = torch::linalg_eigh(scatter, "L");
  auto top_values = values.slice(0, hidden - rank);
  auto basis = vectors.slice(1, hidden - rank).contiguous();
  if (!torch::isfinite(top_values).all().item<bool>() || !(top_values > 0).all().item<bool>()) {
    fail("Target head has insufficient positive principal directions for transfer_rank {}", rank);
  }
  auto codes = torch::empty({vocab, rank}, f32);
  auto scale = correctly_rounded_sqrt(top_values);
  for (int64_t begin = 0; begin < vocab; begin += chunk_size) {
    auto rows = unit_rows(head.slice(0, begin, begin + chunk_size).to(torch::kFloat32));
    codes.slice(0, begin, begin + chunk_size).copy_(unit_rows((rows - mean).matmul(basis) / scale));
  }
  return {codes, basis, top_values};
}

}  // namespace dspine::model
