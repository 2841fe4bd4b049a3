// The adjacent injection's receiver and predecessor rows, on raw device pointers (docs/kernels.md,
// "Injection pairs"). Per block of T positions of the layer's transfer features f [blocks, T, r]
// and its anchor code a [blocks, r], proposal k (0 ≤ k < T − 1) receives at position k + 1 and
// reads its predecessor from position k, the anchor standing in for position 0:
//   receiver[k] = f[k + 1],   predecessor[k] = k == 0 ? a : f[k].
// One pass writes both [blocks, T − 1, r] tensors, which slicing and a concatenation wrote in two
// (plus a copy for the strided receiver); the backward is its transpose:
//   df[0] = 0,  df[j] = dreceiver[j − 1] + dpredecessor[j] (0 < j < T − 1),
//   df[T − 1] = dreceiver[T − 2],  da = dpredecessor[0],
// the sums in fp32, rounded once.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/norm_swiglu_types.h"

namespace dspine::kernels {

struct InjectionPairShape {
  int64_t blocks = 0;
  int64_t positions = 2;  // T ≥ 2
  int64_t rank = 0;       // r; every row contiguous
  DType type = DType::kBFloat16;
};

// Whether the kernels take rows of `rank` elements of `type`: whole 16-byte packs.
bool injection_pairs_supported(int64_t rank, DType type);

cudaError_t injection_pairs_forward(const void* features, const void* anchor, void* receiver,
                                    void* predecessor, const InjectionPairShape& shape,
                                    cudaStream_t stream);

cudaError_t injection_pairs_backward(const void* grad_receiver, const void* grad_predecessor,
                                     void* grad_features, void* grad_anchor,
                                     const InjectionPairShape& shape, cudaStream_t stream);

}  // namespace dspine::kernels
