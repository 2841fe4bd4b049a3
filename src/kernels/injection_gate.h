// The adjacent injection's gated messages for decoding, on raw device pointers (docs/kernels.md,
// "Injection gate"). The decoding path projects a layer's state h once,
//   y = h · [R; G_r·R; G_p·R; M·R]ᵀ        (readout R, receiver gate G_r, predecessor gate G_p,
//                                           message M: [r | m | m | m] columns per row)
// (the feature norm scales a readout row by one number, so it commutes with the three maps), and
// this kernel makes every slot's message from its own row of y and its predecessor's:
//   s_t   = 1 / sqrt(mean(readout_t²) + eps)                    (the feature norm's scale)
//   out_t = rms(h_t) · σ(s_t·rg_t + bias + p_t) ⊙ q_t            for slots t = 1 .. T − 1,
//   (p_t, q_t) = s_{t−1}·(pg_{t−1}, msg_{t−1}) for t ≥ 2, the anchor's row of `anchor_table` for t
//   = 1, out_0 = 0                                                   (the anchor's slot is not
//   written),
// with rms(h) = ‖h‖ / √H, so that the residual write h + rms(h) · write(messages) is one GEMM that
// adds out · Wᵀ into h. fp32 inside, each output rounded once. No backward: decoding only.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/norm_swiglu_types.h"

namespace dspine::kernels {

struct InjectionGateShape {
  int64_t rows = 0;     // B·T rows of y, h and out, contiguous
  int64_t slots = 2;    // T, the rows of one block (≥ 2)
  int64_t rank = 0;     // r
  int64_t message = 0;  // m
  int64_t hidden = 0;   // H
  float eps = 0.0f;     // the feature norm's
  DType type = DType::kBFloat16;
};

// Whether the kernel takes these sizes (positive, T ≥ 2).
bool injection_gate_supported(const InjectionGateShape& shape);

// y [rows, r + 3m], h [rows, H], anchor_table [V, 2m] (the anchor code's predecessor-gate and
// message terms), anchor_ids: block b's anchor token at anchor_ids[b · id_stride], bias [m];
// out [rows, m].
cudaError_t injection_gate_forward(const void* y, const void* h, const void* anchor_table,
                                   const int64_t* anchor_ids, int64_t id_stride, const void* bias,
                                   void* out, const InjectionGateShape& shape, cudaStream_t stream);

}  // namespace dspine::kernels
