// DSpine block attention as a tensor operation: the fused CUDA kernels (src/kernels/
// block_attention.h) wrapped as an autograd function, and the dense masked SDPA reference they are
// tested against (docs/kernels.md, "Block attention").
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace dspine::ops {

// Whether the fused kernels take these inputs: CUDA bf16 q [B, N·bs, H, D] and k [B, S + N·bs,
// KVH, D] with D 64 or 128, H a multiple of KVH and bs · H/KVH ≤ 64.
bool block_attention_fusable(const at::Tensor& q, const at::Tensor& k, int64_t block_size);

// The same for the head layout alone (any rows, context or block count are taken).
bool block_attention_heads_supported(int64_t heads, int64_t kv_heads, int64_t head_dim,
                                     int64_t block_size);

// softmax(scale · q kᵀ + DSpine block mask) v for q [B, N·bs, H, D], k, v [B, S + N·bs, KVH, D]
// (context keys first), anchors [B, N] int64 and keep [B, N] bool: query j of block n sees
// context keys k < anchors[n] and its own block's positions ≤ j; dropped blocks (keep false) give
// zeros. Returns [B, N·bs, H, D]; gradients flow to q, k and v. Throws dspine::Error naming the
// shapes when !block_attention_fusable, and naming the scale unless scale > 0 (the kernels' online
// softmax takes its maxima on unscaled scores).
at::Tensor block_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& anchors, const at::Tensor& keep, int64_t block_size,
                           double scale);

}  // namespace dspine::ops
