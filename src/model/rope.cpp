#include "model/rope.h"

#include <torch/torch.h>

namespace dspine::model {

at::Tensor rope_inv_freq(int64_t head_dim, double theta) {
  auto exponent = torch::arange(0, head_dim, 2, torch::kInt64).to(torch::kFloat32) /
                  static_cast<double>(head_dim);
  return 1.0 / torch::pow(theta, exponent);
}

RopeTables rope_tables(const at::Tensor& position_ids, const at::Tensor& inv_freq,
                       at::ScalarType dtype) {
  auto angles = position_ids.to(torch::kFloat32).unsqueeze(-1) *
                inv_freq.to(position_ids.device()).view({1, 1, -1});
  auto emb = torch::cat({angles, angles}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

namespace {
at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}
}  // namespace

at::Tensor apply_rope(const at::Tensor& x, const RopeTables& tables) {
  const int64_t rows = x.size(1);
  const int64_t total = tables.cos.size(1);
  auto cos = tables.cos.slice(1, total - rows).unsqueeze(2);
  auto sin = tables.sin.slice(1, total - rows).unsqueeze(2);
  return x * cos + rotate_half(x) * sin;
}

}  // namespace dspine::model
