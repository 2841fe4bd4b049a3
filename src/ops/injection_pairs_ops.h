// The adjacent injection's receiver and predecessor rows as tensor operations (docs/kernels.md,
// "Injection pairs"): for transfer features [..., T, r] and the anchor's code [..., 1, r],
//   receiver = features[..., 1:, :],  predecessor = cat(anchor, features[..., 1:T−1, :]),
// both [..., T − 1, r]. The ATen reference is the oracle; the fused CUDA kernels
// (src/kernels/injection_pairs.h) write both in one pass and sum their gradients in one.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace dspine::ops {

// {receiver, predecessor} by slicing and concatenation (autograd through ATen).
std::pair<at::Tensor, at::Tensor> injection_pairs_reference(const at::Tensor& features,
                                                            const at::Tensor& anchor);

// CUDA fp32/fp16/bf16, anchor of features' dtype on its device shaped [..., 1, r], T ≥ 2, and rows
// of whole 16-byte packs.
bool injection_pairs_fusable(const at::Tensor& features, const at::Tensor& anchor);

// The fused kernels as one autograd node; throws dspine::Error naming the shapes when
// !injection_pairs_fusable.
std::pair<at::Tensor, at::Tensor> injection_pairs_fused(const at::Tensor& features,
                                                        const at::Tensor& anchor);

}  // namespace dspine::ops
