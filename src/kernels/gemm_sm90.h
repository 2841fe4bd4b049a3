// The project's own bf16 GEMM on Hopper (docs/kernels.md, "GEMM"), on raw device pointers:
// C [M, N] = A [M, K] · Bᵀ (B [N, K]), both operands K-major as a linear layer's input and weight
// are, fp32 accumulation, one rounding to bf16. Its epilogue can add a residual before that
// rounding, so a layer's residual add costs no pass of its own. TMA copies tiles into a
// multi-stage shared-memory ring; two consumer warpgroups multiply them with wgmma (128 × 256
// tiles) while a producer warp keeps the ring full; persistent CTAs walk the tiles in groups of
// eight tile rows, so that the B tiles a group reads stay in L2. The epilogue stages a tile in
// shared memory (the residual loaded there by TMA) and stores it with TMA while the next tile's
// products run.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace dspine::kernels {

// Whether the GEMM takes these operands on the current device: compute capability 9.0 (sm_90a
// code), rows of A, B, C and the residual 16-byte aligned (K and N multiples of 8, 16-byte aligned
// bases: TMA copies them all), and M, N, K in [1, 2^31).
bool gemm_bf16_supported(const void* a, const void* b, const void* c, const void* residual,
                         int64_t m, int64_t n, int64_t k);

// C = A · Bᵀ (+ residual [M, N] when non-null; it may be C itself). Row-major, leading
// dimensions K, K, N and N. cudaErrorNotSupported where gemm_bf16_supported does not hold.
cudaError_t gemm_bf16(const void* a, const void* b, void* c, const void* residual, int64_t m,
                      int64_t n, int64_t k, cudaStream_t stream);

// A SwiGLU MLP's gate/up projection and activation in one pass: gate_up [M, 2I] = A · Wᵀ for the
// packed weight W [2I, K] (gate rows, then up rows), and act [M, I] = silu(gate) · up computed from
// gate_up's rounded values as the SwiGLU kernels compute it (kernels/swiglu.h), so a backward that
// recomputes the activation from gate_up gets the same bits. Each tile multiplies 128 gate rows
// and the same 128 up rows of W, so both halves of an element are in one thread's registers.
bool gemm_bf16_swiglu_supported(const void* a, const void* w, const void* gate_up, const void* act,
                                int64_t m, int64_t intermediate, int64_t k);
cudaError_t gemm_bf16_swiglu(const void* a, const void* w, void* gate_up, void* act, int64_t m,
                             int64_t intermediate, int64_t k, cudaStream_t stream);

}  // namespace dspine::kernels
