#include "ops/rms_norm_ops.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/torch.h>

#include "core/error.h"
#include "ops/kernel_launch.h"
#include "kernels/rms_norm.h"

namespace dspine::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// [rows, hidden] view with contiguous, 16-byte aligned rows (a fresh copy when a view is offset).
at::Tensor as_rows(const at::Tensor& t, int64_t hidden) {
  at::Tensor rows = t.reshape({-1, hidden}).contiguous();
  if (reinterpret_cast<uintptr_t>(rows.data_ptr()) % 16 != 0) rows = rows.clone();
  return rows;
}

void require_fusable(const at::Tensor& x, const at::Tensor& weight) {
  if (!rms_norm_fusable(x, weight)) {
    fail(
        "fused RMSNorm needs CUDA fp32/fp16/bf16 input [..., H] with a weight [H] of the same "
        "dtype; got input {} {} on {} and weight {} {}",
        c10::str(x.sizes()), c10::toString(x.scalar_type()), x.device().str(),
        c10::str(weight.sizes()), c10::toString(weight.scalar_type()));
  }
}

// Shared by the plain and residual forms: y = norm(s) * weight where s = x (+ residual).
struct Forward {
  at::Tensor sum, y, rstd;
};

Forward launch_forward(const at::Tensor& x, const at::Tensor* residual, const at::Tensor& weight,
                       double eps) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t hidden = x.size(-1);
  kernels::DType dtype = kernels::DType::kFloat32;
  kernel_dtype(x.scalar_type(), &dtype);
  const at::Tensor x2 = as_rows(x, hidden);
  const at::Tensor w = weight.contiguous();
  Forward out;
  out.y = at::empty_like(x2);
  out.rstd = at::empty({x2.size(0)}, x2.options().dtype(at::kFloat));
  at::Tensor r2;
  if (residual != nullptr) {
    r2 = as_rows(*residual, hidden);
    out.sum = at::empty_like(x2);
  }
  check_launch(
      kernels::rms_norm_forward(x2.data_ptr(), residual ? r2.data_ptr() : nullptr, w.data_ptr(),
                                residual ? out.sum.data_ptr() : nullptr, out.y.data_ptr(),
                                out.rstd.data_ptr<float>(), x2.size(0), hidden, float(eps), dtype,
                                at::cuda::getCurrentCUDAStream()),
      "RMSNorm forward", x);
  return out;
}

// {dx, dweight} for saved s [rows, H], weight, rstd; dsum may be undefined.
std::pair<at::Tensor, at::Tensor> launch_backward(const at::Tensor& dy, const at::Tensor& dsum,
                                                  const at::Tensor& s, const at::Tensor& weight,
                                                  const at::Tensor& rstd) {
  const c10::cuda::CUDAGuard guard(s.device());
  const int64_t hidden = s.size(1);
  kernels::DType dtype = kernels::DType::kFloat32;
  kernel_dtype(s.scalar_type(), &dtype);
  const at::Tensor dy2 = dy.defined() ? as_rows(dy, hidden) : at::zeros_like(s);
  const at::Tensor dsum2 = dsum.defined() ? as_rows(dsum, hidden) : at::Tensor();
  at::Tensor dx = at::empty_like(s);
  at::Tensor dweight = at::empty_like(weight);
  const size_t bytes = kernels::rms_norm_backward_workspace_bytes(s.size(0), hidden, dtype);
  at::Tensor workspace =
      at::empty({int64_t(bytes / sizeof(float)) + 1}, s.options().dtype(at::kFloat));
  check_launch(
      kernels::rms_norm_backward(dy2.data_ptr(), dsum2.defined() ? dsum2.data_ptr() : nullptr,
                                 s.data_ptr(), weight.data_ptr(), rstd.data_ptr<float>(),
                                 dx.data_ptr(), dweight.data_ptr(), workspace.data_ptr(), s.size(0),
                                 hidden, dtype, at::cuda::getCurrentCUDAStream()),
      "RMSNorm backward", s);
  return {dx, dweight};
}

struct RMSNormFunction : public torch::autograd::Function<RMSNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            double eps) {
    Forward out = launch_forward(x, nullptr, weight, eps);
    ctx->save_for_backward({as_rows(x, x.size(-1)), weight.contiguous(), out.rstd});
    return out.y.view(x.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [dx, dweight] = launch_backward(grads[0], at::Tensor(), saved[0], saved[1], saved[2]);
    return {dx.view(grads[0].sizes()), dweight, at::Tensor()};
  }
};

struct AddRMSNormFunction : public torch::autograd::Function<AddRMSNormFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const at::Tensor& residual, const at::Tensor& weight, double eps) {
    Forward out = launch_forward(x, &residual, weight, eps);
    ctx->save_for_backward({out.sum, weight.contiguous(), out.rstd});
    return {out.sum.view(x.sizes()), out.y.view(x.sizes())};
  }

  // The gradient of x and of residual is the same tensor: d(sum) + d(norm(sum)).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [dx, dweight] = launch_backward(grads[1], grads[0], saved[0], saved[1], saved[2]);
    const auto shape = grads[1].defined() ? grads[1].sizes() : grads[0].sizes();
    dx = dx.view(shape);
    return {dx, dx, dweight, at::Tensor()};
  }
};

// x returned as an output (autograd makes it a view of x with this node's gradient edge) beside
// its norm; the backward is AddRMSNormFunction's with x as the saved sum.
struct RMSNormResidualFunction : public torch::autograd::Function<RMSNormResidualFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               double eps) {
    Forward out = launch_forward(x, nullptr, weight, eps);
    ctx->save_for_backward({as_rows(x, x.size(-1)), weight.contiguous(), out.rstd});
    return {x, out.y.view(x.sizes())};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [dx, dweight] = launch_backward(grads[1], grads[0], saved[0], saved[1], saved[2]);
    const auto shape = grads[1].defined() ? grads[1].sizes() : grads[0].sizes();
    return {dx.view(shape), dweight, at::Tensor()};
  }
};

}  // namespace

at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

std::pair<at::Tensor, at::Tensor> add_rms_norm_reference(const at::Tensor& x,
                                                         const at::Tensor& residual,
                                                         const at::Tensor& weight, double eps) {
  at::Tensor sum = x + residual;
  return {sum, rms_norm_reference(sum, weight, eps)};
}

bool rms_norm_fusable(const at::Tensor& x, const at::Tensor& weight) {
  kernels::DType dtype = kernels::DType::kFloat32;
  if (!x.is_cuda() || x.dim() == 0 || !kernel_dtype(x.scalar_type(), &dtype)) return false;
  const int64_t hidden = x.size(-1);
  return weight.scalar_type() == x.scalar_type() && weight.device() == x.device() &&
         weight.dim() == 1 && weight.size(0) == hidden && hidden > 0;
}

at::Tensor rms_norm_fused(const at::Tensor& x, const at::Tensor& weight, double eps) {
  require_fusable(x, weight);
  return RMSNormFunction::apply(x, weight, eps);
}

std::pair<at::Tensor, at::Tensor> add_rms_norm_fused(const at::Tensor& x,
                                                     const at::Tensor& residual,
                                                     const at::Tensor& weight, double eps) {
  require_fusable(x, weight);
  if (residual.sizes() != x.sizes() || residual.scalar_type() != x.scalar_type() ||
      residual.device() != x.device()) {
    fail("fused add+RMSNorm: residual {} {} on {} must match input {} {} on {}",
         c10::str(residual.sizes()), c10::toString(residual.scalar_type()), residual.device().str(),
         c10::str(x.sizes()), c10::toString(x.scalar_type()), x.device().str());
  }
  auto outputs = AddRMSNormFunction::apply(x, residual, weight, eps);
  return {outputs[0], outputs[1]};
}

std::pair<at::Tensor, at::Tensor> rms_norm_residual_fused(const at::Tensor& x,
                                                          const at::Tensor& weight, double eps) {
  require_fusable(x, weight);
  auto outputs = RMSNormResidualFunction::apply(x, weight, eps);
  return {outputs[0], outputs[1]};
}

}  // namespace dspine::ops
