// DSpine block attention on raw device pointers (docs/model.md, "The block attention mask";
// docs/kernels.md, "Block attention"): bf16 in and out, fp32 accumulation, GQA without repeating
// the key/value heads, and only the key tiles the mask lets a block see.
//
// Layout (all contiguous): q, out, dq [B, N·bs, H, D]; k, v, dk, dv [B, S + N·bs, KVH, D] (the
// projected context first, then the block tokens); anchors int64 [B, N]; keep uint8 [B, N];
// lse, delta fp32 [B, N·bs, H]. Query j of block n (anchor a) sees context keys k < a and the keys
// of its own block's positions 0..j; a block with keep = 0 sees nothing and gets zeros.
//
// One CTA owns a block's bs queries for all H/KVH query heads of one kv head (64 rows at the
// recipe's bs 16 and 4 heads per kv head), so every row of a CTA shares the same context prefix
// and the same key/value tiles.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace dspine::kernels {

struct BlockAttentionShape {
  int64_t rows = 0;        // B
  int64_t context = 0;     // S
  int64_t blocks = 0;      // N per row
  int64_t block_size = 0;  // bs
  int64_t heads = 0;       // H
  int64_t kv_heads = 0;    // KVH
  int64_t head_dim = 0;    // D
};

// True when the kernels take the shape: D 64 or 128, H a multiple of KVH, bs · H/KVH ≤ 64, at
// most 65535 rows and 65535 key tiles (⌈S/64⌉ + N).
bool block_attention_supported(const BlockAttentionShape& shape);

// The kernels' matrix instructions: automatic (Hopper's warpgroup MMA where
// block_attention_wgmma_available, else warp-level mma.sync) or mma.sync only (for comparisons).
enum class AttentionInstructions { kAutomatic, kMmaSync };

// Whether this build (sm_90a device code) and the current device run the wgmma kernels, for D 128.
bool block_attention_wgmma_available(int64_t head_dim);

// out = softmax(scale · q kᵀ + mask) v; lse receives each row's log-sum-exp of the scaled scores
// in base 2 (the backward's input; +inf for dropped blocks). scale must be > 0 (else
// cudaErrorInvalidValue).
cudaError_t block_attention_forward(
    const BlockAttentionShape& shape, const void* q, const void* k, const void* v,
    const int64_t* anchors, const uint8_t* keep, float scale, void* out, float* lse,
    cudaStream_t stream, AttentionInstructions instructions = AttentionInstructions::kAutomatic);

// Gradients of the forward: delta (scratch, [B, N·bs, H]) = rowsum(dout ∘ out); dq by one pass
// over each block's visible key tiles; dk and dv by one pass per key tile over the blocks that see
// it, so every gradient element has a single writer (deterministic, no atomics).
cudaError_t block_attention_backward(
    const BlockAttentionShape& shape, const void* q, const void* k, const void* v,
    const void* out, const void* dout, const float* lse, const int64_t* anchors,
    const uint8_t* keep, float scale, float* delta, void* dq, void* dk, void* dv,
    cudaStream_t stream, AttentionInstructions instructions = AttentionInstructions::kAutomatic);

}  // namespace dspine::kernels
