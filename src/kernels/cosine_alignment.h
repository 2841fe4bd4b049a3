// The DSpine alignment term's cosine, cos = <f, u> / (max(|f|, eps) · max(|u|, eps)), between every
// layer's feature row f and its label's transfer code u, on raw device pointers (docs/kernels.md,
// "Cosine alignment"). One warp per row reads f once in the forward and twice in the backward
// (the reductions, then the gradient), where ATen's cosine_similarity widens f to fp32, broadcasts
// u to f's full size and normalises both there.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/norm_swiglu_types.h"

namespace dspine::kernels {

// f [blocks, layers, positions, rank] (rows of `rank` contiguous elements of `type`, the other
// dims strided); u [blocks, positions, rank] fp32 contiguous, one code per (block, position) that
// every layer's row is compared with.
struct AlignmentRows {
  int64_t blocks = 0, layers = 0, positions = 0, rank = 0;
  int64_t block_stride = 0, layer_stride = 0, position_stride = 0;  // of f, in elements
  float eps = 1e-8f;
  DType type = DType::kBFloat16;
};

// Whether the kernels take rows of `rank` elements of `type` (fp32 or bf16, rank a multiple of 8).
bool cosine_alignment_supported(int64_t rank, DType type);

// cosine [blocks, layers, positions] fp32.
cudaError_t cosine_alignment_forward(const void* features, const float* codes, float* cosine,
                                     const AlignmentRows& shape, cudaStream_t stream);

// grad_features [blocks, layers, positions, rank] contiguous, of f's type:
// g / (|f| |u|) · u − g · cos / |f|² · f (the norms clamped at eps as in the forward).
cudaError_t cosine_alignment_backward(const float* grad_cosine, const void* features,
                                      const float* codes, void* grad_features,
                                      const AlignmentRows& shape, cudaStream_t stream);

}  // namespace dspine::kernels
