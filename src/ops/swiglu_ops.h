// SwiGLU activation silu(gate) * up as tensor operations: the ATen reference and the fused CUDA
// kernels (src/kernels/swiglu.h) as autograd functions whose backward recomputes the activation
// in fp32 from gate and up (nothing extra is saved).
#pragma once

#include <ATen/core/Tensor.h>

namespace dspine::ops {

at::Tensor swiglu_reference(const at::Tensor& gate, const at::Tensor& up);

// Whether the fused kernel takes these inputs: CUDA, one fp32/fp16/bf16 dtype, one shape. Rows
// may be strided (views of a wider tensor); a last dimension that is not contiguous is copied.
bool swiglu_fusable(const at::Tensor& gate, const at::Tensor& up);

// silu(gate) * up for separate gate and up tensors of one shape [..., I].
at::Tensor swiglu_fused(const at::Tensor& gate, const at::Tensor& up);

// silu(g) * u where gate_up = [..., 2I] holds g in its first half and u in its second (the output
// of one fused gate/up projection); the gradient comes back as one [..., 2I] tensor, so the
// projection's backward stays one GEMM.
at::Tensor swiglu_packed_fused(const at::Tensor& gate_up);

// Inference's SwiGLU MLP added to `out` [..., H] in place (no gradient; the caller owns out):
// out += (silu(g) * u) · down_weightᵀ with [g | u] = x · gate_up_weightᵀ (one GEMM), the addition
// made by the down GEMM (β = 1). The activation is the fused kernel when `fused` and
// swiglu_fusable take it. Returns out, made contiguous first if it was not.
at::Tensor swiglu_mlp_add_(at::Tensor out, const at::Tensor& x, const at::Tensor& gate_up_weight,
                           const at::Tensor& down_weight, bool fused);

// Whether swiglu_down_fused takes these: gate_up as swiglu_fusable takes it, with an even last
// dimension 2I, a 2-D down weight [H, I] and, if defined, a residual [..., H], all of gate_up's
// dtype on its device.
bool swiglu_down_fusable(const at::Tensor& gate_up, const at::Tensor& down_weight,
                         const at::Tensor& residual = {});

// silu(g) * u · down_weightᵀ (+ residual) for gate_up = [..., 2I] (g and u its halves) and
// down_weight [H, I]: the SwiGLU MLP's activation and down projection as one autograd node that
// keeps gate_up and the weight but not the activation [..., I] (the largest tensor a layer would
// keep besides gate_up). Its backward recomputes the activation in the SwiGLU backward pass, in the
// memory of the activation's gradient, for the weight gradient's GEMM. A residual [..., H] (the
// decoder layer's) is added in the down GEMM's epilogue where the project's GEMM takes the
// operands (ops/gemm_ops.h: in fp32, before the one rounding), else after at::mm; its gradient is
// the output's. Returns [..., H].
at::Tensor swiglu_down_fused(const at::Tensor& gate_up, const at::Tensor& down_weight,
                             const at::Tensor& residual = {});

// Whether swiglu_mlp_fused takes these: contiguous CUDA bf16 x [..., H], gate/up weight [2I, H]
// (gate rows, then up rows), down weight [H, I] and residual shaped as x, all on x's device, with
// the alignments and device the project's GEMM needs (kernels/gemm_sm90.h).
bool swiglu_mlp_fusable(const at::Tensor& x, const at::Tensor& gate_up_weight,
                        const at::Tensor& down_weight, const at::Tensor& residual);

// residual + down(silu(gate) · up) with [gate, up] = x · gate_up_weightᵀ: a SwiGLU MLP and its
// residual add as one autograd node on the project's GEMM. The gate/up product writes gate_up and
// the activation in its epilogue (no SwiGLU pass of its own), the down product adds the residual
// in its own; the backward is swiglu_down_fused's and a linear layer's, the activation recomputed.
at::Tensor swiglu_mlp_fused(const at::Tensor& x, const at::Tensor& gate_up_weight,
                            const at::Tensor& down_weight, const at::Tensor& residual);

}  // namespace dspine::ops
