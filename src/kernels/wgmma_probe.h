// One tile of each block-attention product through wgmma (kernels/wgmma.cuh), for tests of the
// shared-memory descriptor conventions: S = Q·Kᵀ with Q, K [64, 128] bf16 row-major and S
// [64, 64] fp32, and O = P·V with P [64, 64], V [64, 128] bf16 and O [64, 128] fp32. K and V go
// to shared memory in the attention kernels' swizzled tile layout and are read through the same
// descriptors.
#pragma once

#include <cuda_runtime_api.h>

namespace dspine::kernels {

// Whether this build has wgmma code (compiled for sm_90a) and the current device runs it.
bool wgmma_available();

cudaError_t wgmma_probe(const void* q, const void* k, const void* p, const void* v, float* s,
                        float* o, cudaStream_t stream);

}  // namespace dspine::kernels
