// The DSpine attention's input projections as one autograd node: q from the block tokens, k and v
// from the context followed by the block tokens, written straight into the [B, S + Q, ·] tensors
// the attention kernels read. Its backward sums each input's gradient inside the GEMMs (β = 1)
// instead of in separate passes over [B, Q, H] (docs/model.md, "Attention projections").
#pragma once

#include <ATen/core/Tensor.h>

namespace dspine::ops {

struct AttentionProjections {
  at::Tensor q;  // [B, Q, Hq·D]
  at::Tensor k;  // [B, S + Q, KVH·D]: the context's keys, then the block tokens'
  at::Tensor v;  // [B, S + Q, KVH·D]
};

// x [B, Q, H] and context [B, S, H] of one dtype and device; q_weight [Hq·D, H], k_weight and
// v_weight [KVH·D, H] (Linear weights, no bias). The same values as
//   q = x·q_weightᵀ, k = cat(context·k_weightᵀ, x·k_weightᵀ), v likewise,
// up to the rounding of the sums (each gradient is accumulated in the GEMMs' fp32 accumulators
// before its one rounding). Any of the five may be a leaf without a gradient.
AttentionProjections attention_projections(const at::Tensor& x, const at::Tensor& context,
                                           const at::Tensor& q_weight, const at::Tensor& k_weight,
                                           const at::Tensor& v_weight);

}  // namespace dspine::ops
