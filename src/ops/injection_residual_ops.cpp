#include "ops/injection_residual_ops.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/autograd.h>

#include <cmath>

#include "core/error.h"
#include "kernels/injection_residual.h"
#include "ops/kernel_launch.h"

namespace dspine::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool shapes_pair(const at::Tensor& h, const at::Tensor& delta, bool skip_first) {
  if (h.dim() < 2 || delta.dim() != h.dim()) return false;
  const int64_t positions = h.size(-2);
  for (int64_t d = 0; d < h.dim(); ++d) {
    const int64_t expected = d == h.dim() - 2 && skip_first ? positions - 1 : h.size(d);
    if (delta.size(d) != expected) return false;
  }
  return !skip_first || positions >= 2;
}

kernels::InjectionRows kernel_rows(const at::Tensor& h, bool skip_first) {
  kernels::InjectionRows rows;
  rows.hidden = h.size(-1);
  rows.positions = h.size(-2);
  rows.rows = h.numel() / rows.hidden;
  rows.skip_first = skip_first;
  kernel_dtype(h.scalar_type(), &rows.type);
  return rows;
}

struct InjectionResidualFunction : torch::autograd::Function<InjectionResidualFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& delta,
                            bool skip_first) {
    const c10::cuda::CUDAGuard guard(h.device());
    const auto hc = h.contiguous(), dc = delta.contiguous();
    const auto shape = kernel_rows(hc, skip_first);
    auto out = at::empty_like(hc);
    auto rms = at::empty({shape.rows}, hc.options().dtype(at::kFloat));
    check_launch(kernels::injection_residual_forward(hc.data_ptr(), dc.data_ptr(), out.data_ptr(),
                                                     rms.data_ptr<float>(), shape,
                                                     at::cuda::getCurrentCUDAStream()),
                 "injection residual forward", hc);
    ctx->save_for_backward({hc, dc, rms});
    ctx->saved_data["skip_first"] = skip_first;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &h = saved[0], &delta = saved[1], &rms = saved[2];
    const bool skip_first = ctx->saved_data["skip_first"].toBool();
    const c10::cuda::CUDAGuard guard(h.device());
    const auto grad = grads[0].contiguous();
    auto grad_h = at::empty_like(h);
    auto grad_delta = at::empty_like(delta);
    check_launch(kernels::injection_residual_backward(
                     grad.data_ptr(), h.data_ptr(), delta.data_ptr(), rms.data_ptr<float>(),
                     grad_h.data_ptr(), grad_delta.data_ptr(), kernel_rows(h, skip_first),
                     at::cuda::getCurrentCUDAStream()),
                 "injection residual backward", h);
    return {grad_h, grad_delta, at::Tensor()};
  }
};

}  // namespace

at::Tensor injection_residual_reference(const at::Tensor& h, const at::Tensor& delta,
                                        bool skip_first) {
  const auto written = skip_first ? h.slice(-2, 1) : h;
  // fp32 accumulation (fp64 for fp64 inputs) without a widened copy of h.
  const auto accumulate = at::promote_types(at::kFloat, h.scalar_type());
  const auto rms = (at::linalg_vector_norm(written, 2, {-1}, true, accumulate) /
                    std::sqrt(static_cast<double>(h.size(-1))))
                       .to(h.scalar_type());
  auto out = written + rms * delta;
  return skip_first ? at::cat({h.slice(-2, 0, 1), out}, -2) : out;
}

bool injection_residual_fusable(const at::Tensor& h, const at::Tensor& delta, bool skip_first) {
  kernels::DType type = kernels::DType::kFloat32;
  return h.is_cuda() && delta.device() == h.device() && delta.scalar_type() == h.scalar_type() &&
         kernel_dtype(h.scalar_type(), &type) && shapes_pair(h, delta, skip_first) &&
         kernels::injection_residual_supported(h.size(-1), type);
}

at::Tensor injection_residual_fused(const at::Tensor& h, const at::Tensor& delta,
                                    bool skip_first) {
  if (!injection_residual_fusable(h, delta, skip_first)) {
    fail("fused injection residual: h {} {} on {} and delta {} {} (skip_first {}) are not "
         "taken: CUDA fp32/fp16/bf16, delta [..., T{}, H] of h's dtype, H·bytes a multiple of 16",
         c10::toString(h.scalar_type()), c10::str(h.sizes()), h.device().str(),
         c10::toString(delta.scalar_type()), c10::str(delta.sizes()), skip_first,
         skip_first ? " − 1" : "");
  }
  return InjectionResidualFunction::apply(h, delta, skip_first);
}

}  // namespace dspine::ops
