// Linear-layer products through the project's own GEMM (kernels/gemm_sm90.h, docs/kernels.md,
// "GEMM") where it takes the operands, else through ATen: the same function either way.
#pragma once

#include <ATen/core/Tensor.h>

namespace dspine::ops {

// Whether the own GEMM takes x [rows, K] · weightᵀ (weight [N, K]) (+ residual [rows, N]): CUDA
// bf16 on one device, contiguous rows, alignments and the device as gemm_bf16_supported wants.
bool own_gemm_takes(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& residual = {});

// x · weightᵀ (+ residual, added before the one rounding to x's dtype on the own GEMM; after
// at::mm's rounding on the ATen path). x [rows, K], weight [N, K], residual [rows, N] or undefined.
at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& weight,
                       const at::Tensor& residual = {});

}  // namespace dspine::ops
