// The adjacent injection's gated messages of one decoding layer (docs/kernels.md, "Injection
// gate"; src/kernels/injection_gate.h has the formula): the ATen reference, which is the oracle
// and the CPU path, and the fused CUDA kernel. Decoding only: no gradient is taken.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dspine::ops {

// y [B, T, r + 3m] (the state's readout, then its receiver gate, predecessor gate and message
// terms before the feature norm), h [B, T, H] (the state the messages are written into),
// anchor_table [V, 2m] (the predecessor gate and message terms of every token's anchor code),
// anchor_ids [B] int64 (each block's anchor token, any stride), bias [m]; eps is the feature
// norm's. Returns the messages [B, T, m] scaled by rms(h), slot 0 of every block zero.
at::Tensor injection_gate_reference(const at::Tensor& y, const at::Tensor& h,
                                    const at::Tensor& anchor_table, const at::Tensor& anchor_ids,
                                    const at::Tensor& bias, int64_t rank, double eps);

// CUDA fp32/fp16/bf16, every input but the ids of y's dtype on its device, y and h contiguous.
bool injection_gate_fusable(const at::Tensor& y, const at::Tensor& h,
                            const at::Tensor& anchor_table, const at::Tensor& anchor_ids,
                            const at::Tensor& bias, int64_t rank);

// injection_gate_reference by the fused kernel, fp32 inside and rounded once; throws
// dspine::Error naming the shapes when !injection_gate_fusable.
at::Tensor injection_gate_fused(const at::Tensor& y, const at::Tensor& h,
                                const at::Tensor& anchor_table, const at::Tensor& anchor_ids,
                                const at::Tensor& bias, int64_t rank, double eps);

}  // namespace dspine::ops
