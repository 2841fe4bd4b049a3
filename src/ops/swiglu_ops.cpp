#include "ops/swiglu_ops.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/torch.h>

#include "core/error.h"
#include "kernels/gemm_sm90.h"
#include "kernels/swiglu.h"
#include "ops/gemm_ops.h"
#include "ops/kernel_launch.h"

namespace dspine::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// [rows, cols] view whose last dimension is contiguous (copied only when it is not).
at::Tensor as_rows(const at::Tensor& t, int64_t cols) {
  at::Tensor rows = t.reshape({-1, cols});
  return rows.stride(1) == 1 ? rows : rows.contiguous();
}

kernels::DType dtype_of(const at::Tensor& t) {
  kernels::DType dtype = kernels::DType::kFloat32;
  kernel_dtype(t.scalar_type(), &dtype);
  return dtype;
}

// out = silu(gate) * up; gate and up are [rows, I] views with contiguous rows.
at::Tensor launch_forward(const at::Tensor& gate, const at::Tensor& up) {
  const c10::cuda::CUDAGuard guard(gate.device());
  at::Tensor out = at::empty(gate.sizes(), gate.options());
  check_launch(kernels::swiglu_forward(gate.data_ptr(), gate.stride(0), up.data_ptr(), up.stride(0),
                                       out.data_ptr(), out.stride(0), {gate.size(0), gate.size(1)},
                                       dtype_of(gate), at::cuda::getCurrentCUDAStream()),
               "SwiGLU forward", gate);
  return out;
}

// Writes d(gate) and d(up) into the [rows, I] views dgate and dup.
void launch_backward(const at::Tensor& dout, const at::Tensor& gate, const at::Tensor& up,
                     at::Tensor& dgate, at::Tensor& dup) {
  const c10::cuda::CUDAGuard guard(gate.device());
  const at::Tensor d = as_rows(dout, gate.size(1));
  check_launch(kernels::swiglu_backward(
                   d.data_ptr(), d.stride(0), gate.data_ptr(), gate.stride(0), up.data_ptr(),
                   up.stride(0), dgate.data_ptr(), dgate.stride(0), dup.data_ptr(), dup.stride(0),
                   {gate.size(0), gate.size(1)}, dtype_of(gate), at::cuda::getCurrentCUDAStream()),
               "SwiGLU backward", gate);
}

// Writes d(gate) and d(up) into dgate and dup, then the activation over dout_act ([rows, I],
// contiguous rows; it held the activation's gradient).
void launch_backward_recompute(at::Tensor& dout_act, const at::Tensor& gate, const at::Tensor& up,
                               at::Tensor& dgate, at::Tensor& dup) {
  const c10::cuda::CUDAGuard guard(gate.device());
  check_launch(kernels::swiglu_backward_recompute(
                   dout_act.data_ptr(), dout_act.stride(0), gate.data_ptr(), gate.stride(0),
                   up.data_ptr(), up.stride(0), dgate.data_ptr(), dgate.stride(0), dup.data_ptr(),
                   dup.stride(0), {gate.size(0), gate.size(1)}, dtype_of(gate),
                   at::cuda::getCurrentCUDAStream()),
               "SwiGLU backward with the activation", gate);
}

struct SwiGLUFunction : public torch::autograd::Function<SwiGLUFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    const int64_t cols = gate.size(-1);
    const at::Tensor g = as_rows(gate, cols);
    const at::Tensor u = as_rows(up, cols);
    ctx->save_for_backward({g, u});
    return launch_forward(g, u).view(gate.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor dgate = at::empty(saved[0].sizes(), saved[0].options());
    at::Tensor dup = at::empty(saved[1].sizes(), saved[1].options());
    launch_backward(grads[0], saved[0], saved[1], dgate, dup);
    return {dgate.view(grads[0].sizes()), dup.view(grads[0].sizes())};
  }
};

struct PackedSwiGLUFunction : public torch::autograd::Function<PackedSwiGLUFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up) {
    const int64_t half = gate_up.size(-1) / 2;
    const at::Tensor gu = as_rows(gate_up, 2 * half);
    ctx->save_for_backward({gu});
    std::vector<int64_t> shape = gate_up.sizes().vec();
    shape.back() = half;
    return launch_forward(gu.narrow(1, 0, half), gu.narrow(1, half, half)).view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor gu = ctx->get_saved_variables()[0];
    const int64_t half = gu.size(1) / 2;
    at::Tensor dgu = at::empty(gu.sizes(), gu.options());
    at::Tensor dgate = dgu.narrow(1, 0, half);
    at::Tensor dup = dgu.narrow(1, half, half);
    launch_backward(grads[0], gu.narrow(1, 0, half), gu.narrow(1, half, half), dgate, dup);
    std::vector<int64_t> shape = grads[0].sizes().vec();
    shape.back() = 2 * half;
    return {dgu.view(shape)};
  }
};

// d(gate_up) and d(weight) (undefined unless `weight_grad`) of the SwiGLU + down product whose
// output gradient is `grad`, from the saved gate_up [rows, 2I] and down weight.
std::pair<at::Tensor, at::Tensor> swiglu_down_backward(const at::Tensor& gu,
                                                       const at::Tensor& weight,
                                                       const at::Tensor& grad, bool weight_grad) {
  const int64_t half = gu.size(1) / 2;
  const at::Tensor dy = grad.reshape({-1, weight.size(0)});
  at::Tensor dact_then_act = at::mm(dy, weight);
  at::Tensor dgu = at::empty(gu.sizes(), gu.options());
  at::Tensor dgate = dgu.narrow(1, 0, half);
  at::Tensor dup = dgu.narrow(1, half, half);
  launch_backward_recompute(dact_then_act, gu.narrow(1, 0, half), gu.narrow(1, half, half), dgate,
                            dup);
  at::Tensor dweight;
  if (weight_grad) dweight = at::mm(dy.t(), dact_then_act);
  return {dgu, dweight};
}

// The whole SwiGLU MLP plus its residual as one node: the gate/up GEMM writes gate_up and the
// activation in its epilogue (kernels/gemm_sm90.h), the down GEMM adds the residual in its own.
// Keeps x, gate_up and both weights, as the linear layer and the SwiGLU + down node it stands for
// do; the backward is theirs.
struct SwiGLUMLPFunction : public torch::autograd::Function<SwiGLUMLPFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& gate_up_weight, const at::Tensor& down_weight,
                            const at::Tensor& residual) {
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor rows = x.reshape({-1, x.size(-1)});
    const int64_t intermediate = down_weight.size(1);
    at::Tensor gate_up = at::empty({rows.size(0), 2 * intermediate}, x.options());
    at::Tensor act = at::empty({rows.size(0), intermediate}, x.options());
    check_launch(kernels::gemm_bf16_swiglu(
                     rows.data_ptr(), gate_up_weight.data_ptr(), gate_up.data_ptr(), act.data_ptr(),
                     rows.size(0), intermediate, rows.size(1), at::cuda::getCurrentCUDAStream()),
                 "SwiGLU MLP gate/up GEMM", x);
    ctx->save_for_backward({rows, gate_up, gate_up_weight, down_weight});
    return linear_rows(act, down_weight, residual.reshape({-1, down_weight.size(0)}))
        .view(residual.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &rows = saved[0], &gate_up = saved[1], &gate_up_weight = saved[2];
    auto [dgu, ddown] = swiglu_down_backward(gate_up, saved[3], grads[0], ctx->needs_input_grad(2));
    at::Tensor dgate_up_weight;
    if (ctx->needs_input_grad(1)) dgate_up_weight = at::mm(dgu.t(), rows);
    return {at::mm(dgu, gate_up_weight).view(grads[0].sizes()), dgate_up_weight, ddown, grads[0]};
  }
};

// The SwiGLU + down node's forward: keeps gate_up and the weight, returns the product (plus the
// residual when it is defined, added in the GEMM's epilogue where the project's GEMM takes it).
at::Tensor swiglu_down_forward(AutogradContext* ctx, const at::Tensor& gate_up,
                               const at::Tensor& weight, const at::Tensor& residual) {
  const int64_t half = gate_up.size(-1) / 2;
  const at::Tensor gu = as_rows(gate_up, 2 * half);
  ctx->save_for_backward({gu, weight});
  std::vector<int64_t> shape = gate_up.sizes().vec();
  shape.back() = weight.size(0);
  // The activation lives only until its GEMM has read it.
  const at::Tensor act = launch_forward(gu.narrow(1, 0, half), gu.narrow(1, half, half));
  if (!residual.defined()) return at::mm(act, weight.t()).view(shape);
  return linear_rows(act, weight, residual.reshape({-1, weight.size(0)})).view(shape);
}

// d(gate_up) and d(weight) of the node, shaped as its inputs.
variable_list swiglu_down_gradients(AutogradContext* ctx, const at::Tensor& grad) {
  const auto saved = ctx->get_saved_variables();
  auto [dgu, dweight] = swiglu_down_backward(saved[0], saved[1], grad, ctx->needs_input_grad(1));
  std::vector<int64_t> shape = grad.sizes().vec();
  shape.back() = dgu.size(1);
  return {dgu.view(shape), dweight};
}

struct SwiGLUDownFunction : public torch::autograd::Function<SwiGLUDownFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up,
                            const at::Tensor& weight) {
    return swiglu_down_forward(ctx, gate_up, weight, {});
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return swiglu_down_gradients(ctx, grads[0]);
  }
};

// The same node with the layer's residual added: its gradient is the output's.
struct SwiGLUDownAddFunction : public torch::autograd::Function<SwiGLUDownAddFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up,
                            const at::Tensor& weight, const at::Tensor& residual) {
    return swiglu_down_forward(ctx, gate_up, weight, residual);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out = swiglu_down_gradients(ctx, grads[0]);
    out.push_back(grads[0]);
    return out;
  }
};

void require_fusable(const at::Tensor& gate, const at::Tensor& up, const char* what) {
  if (!swiglu_fusable(gate, up)) {
    fail(
        "{} needs CUDA fp32/fp16/bf16 gate and up of one shape and dtype; got gate {} {} on {} "
        "and up {} {} on {}",
        what, c10::str(gate.sizes()), c10::toString(gate.scalar_type()), gate.device().str(),
        c10::str(up.sizes()), c10::toString(up.scalar_type()), up.device().str());
  }
}

}  // namespace

at::Tensor swiglu_reference(const at::Tensor& gate, const at::Tensor& up) {
  return at::silu(gate) * up;
}

at::Tensor swiglu_mlp_add_(at::Tensor out, const at::Tensor& x, const at::Tensor& gate_up_weight,
                           const at::Tensor& down_weight, bool fused) {
  const auto gate_up = at::linear(x, gate_up_weight);
  const int64_t inter = gate_up.size(-1) / 2;
  const auto gate = gate_up.narrow(-1, 0, inter), up = gate_up.narrow(-1, inter, inter);
  const auto mlp =
      fused && swiglu_fusable(gate, up) ? swiglu_fused(gate, up) : swiglu_reference(gate, up);
  if (!out.is_contiguous()) out = out.contiguous();
  out.view({-1, out.size(-1)}).addmm_(mlp.reshape({-1, inter}), down_weight.t());
  return out;
}

bool swiglu_fusable(const at::Tensor& gate, const at::Tensor& up) {
  kernels::DType dtype;
  return gate.is_cuda() && gate.dim() > 0 && kernel_dtype(gate.scalar_type(), &dtype) &&
         up.scalar_type() == gate.scalar_type() && up.device() == gate.device() &&
         up.sizes() == gate.sizes();
}

at::Tensor swiglu_fused(const at::Tensor& gate, const at::Tensor& up) {
  require_fusable(gate, up, "fused SwiGLU");
  return SwiGLUFunction::apply(gate, up);
}

at::Tensor swiglu_packed_fused(const at::Tensor& gate_up) {
  require_fusable(gate_up, gate_up, "fused SwiGLU (packed gate_up)");
  if (gate_up.size(-1) % 2 != 0) {
    fail("fused SwiGLU (packed gate_up): last dimension must be 2 * intermediate, got {}",
         c10::str(gate_up.sizes()));
  }
  return PackedSwiGLUFunction::apply(gate_up);
}

bool swiglu_down_fusable(const at::Tensor& gate_up, const at::Tensor& down_weight,
                         const at::Tensor& residual) {
  if (!swiglu_fusable(gate_up, gate_up) || gate_up.size(-1) % 2 != 0 || down_weight.dim() != 2 ||
      down_weight.size(1) != gate_up.size(-1) / 2 ||
      down_weight.scalar_type() != gate_up.scalar_type() ||
      down_weight.device() != gate_up.device()) {
    return false;
  }
  if (!residual.defined()) return true;
  std::vector<int64_t> shape = gate_up.sizes().vec();
  shape.back() = down_weight.size(0);
  return residual.sizes() == c10::IntArrayRef(shape) &&
         residual.scalar_type() == gate_up.scalar_type() && residual.device() == gate_up.device();
}

at::Tensor swiglu_down_fused(const at::Tensor& gate_up, const at::Tensor& down_weight,
                             const at::Tensor& residual) {
  if (!swiglu_down_fusable(gate_up, down_weight, residual)) {
    fail(
        "fused SwiGLU + down projection needs CUDA fp32/fp16/bf16 gate_up [..., 2I], a down "
        "weight [H, I] and a residual [..., H] (or none) of its dtype on its device; got "
        "gate_up {} {} on {}, weight {} {} on {}, residual {}",
        c10::str(gate_up.sizes()), c10::toString(gate_up.scalar_type()), gate_up.device().str(),
        c10::str(down_weight.sizes()), c10::toString(down_weight.scalar_type()),
        down_weight.device().str(),
        residual.defined()
            ? c10::str(residual.sizes()) + " " + c10::toString(residual.scalar_type()) + " on " +
                  residual.device().str()
            : std::string("none"));
  }
  if (residual.defined()) return SwiGLUDownAddFunction::apply(gate_up, down_weight, residual);
  return SwiGLUDownFunction::apply(gate_up, down_weight);
}

bool swiglu_mlp_fusable(const at::Tensor& x, const at::Tensor& gate_up_weight,
                        const at::Tensor& down_weight, const at::Tensor& residual) {
  const auto bf16_on = [&](const at::Tensor& t) {
    return t.defined() && t.is_cuda() && t.device() == x.device() &&
           t.scalar_type() == at::kBFloat16 && t.is_contiguous();
  };
  if (!bf16_on(x) || !bf16_on(gate_up_weight) || !bf16_on(down_weight) || !bf16_on(residual) ||
      gate_up_weight.dim() != 2 || down_weight.dim() != 2 || x.dim() < 1) {
    return false;
  }
  const int64_t hidden = x.size(-1), intermediate = down_weight.size(1);
  if (gate_up_weight.size(0) != 2 * intermediate || gate_up_weight.size(1) != hidden ||
      down_weight.size(0) != hidden || residual.sizes() != x.sizes() || x.numel() == 0) {
    return false;
  }
  const c10::cuda::CUDAGuard guard(x.device());
  // gate_up and the activation are fresh allocations, aligned as every caching-allocator block:
  // x's pointer stands for them (x itself must be aligned as the GEMM's A operand).
  const int64_t rows = x.numel() / hidden;
  return kernels::gemm_bf16_swiglu_supported(x.data_ptr(), gate_up_weight.data_ptr(), x.data_ptr(),
                                             x.data_ptr(), rows, intermediate, hidden) &&
         kernels::gemm_bf16_supported(x.data_ptr(), down_weight.data_ptr(), x.data_ptr(),
                                      residual.data_ptr(), rows, hidden, intermediate);
}

at::Tensor swiglu_mlp_fused(const at::Tensor& x, const at::Tensor& gate_up_weight,
                            const at::Tensor& down_weight, const at::Tensor& residual) {
  if (!swiglu_mlp_fusable(x, gate_up_weight, down_weight, residual)) {
    fail(
        "fused SwiGLU MLP needs contiguous CUDA bf16 x [..., H], a gate/up weight [2I, H], a down "
        "weight [H, I] and a residual shaped as x on a device the project's GEMM runs on; got x "
        "{}, gate/up {}, down {}, residual {}",
        c10::str(x.sizes()), c10::str(gate_up_weight.sizes()), c10::str(down_weight.sizes()),
        residual.defined() ? c10::str(residual.sizes()) : std::string("none"));
  }
  return SwiGLUMLPFunction::apply(x, gate_up_weight, down_weight, residual);
}

}  // namespace dspine::ops
