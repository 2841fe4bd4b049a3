#include "model/rope.h"

#include <torch/torch.h>

#include "ops/qk_norm_rope_ops.h"

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

at::Tensor apply_rope(const at::Tensor& x, const RopeTables& tables) {
  return ops::rope_reference(x, tables.cos, tables.sin);
}

}  // namespace dspine::model
