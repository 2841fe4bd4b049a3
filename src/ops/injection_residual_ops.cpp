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

struct Written {
  at::Tensor out, rms;  // rms [rows] fp32, 0 on skipped rows
};

Written launch_forward(const at::Tensor& h, const at::Tensor& delta, bool skip_first) {
  const auto shape = kernel_rows(h, skip_first);
  Written w{at::empty_like(h), at::empty({shape.rows}, h.options().dtype(at::kFloat))};
  check_launch(kernels::injection_residual_forward(h.data_ptr(), delta.data_ptr(), w.out.data_ptr(),
                                                   w.rms.data_ptr<float>(), shape,
                                                   at::cuda::getCurrentCUDAStream()),
               "injection residual forward", h);
  return w;
}

// {dh, ddelta}; extra_dot [rows] fp32 or undefined (the kernels' e, injection_residual.h).
std::pair<at::Tensor, at::Tensor> launch_backward(const at::Tensor& grad, const at::Tensor& h,
                                                  const at::Tensor& delta, const at::Tensor& rms,
                                                  const at::Tensor& extra_dot, bool skip_first) {
  auto grad_h = at::empty_like(h);
  auto grad_delta = at::empty_like(delta);
  check_launch(
      kernels::injection_residual_backward(
          grad.data_ptr(), h.data_ptr(), delta.data_ptr(), rms.data_ptr<float>(),
          extra_dot.defined() ? extra_dot.data_ptr<float>() : nullptr, grad_h.data_ptr(),
          grad_delta.data_ptr(), kernel_rows(h, skip_first), at::cuda::getCurrentCUDAStream()),
      "injection residual backward", h);
  return {grad_h, grad_delta};
}

// The slots a write changes, and a written tensor with the skipped slot put back in front.
at::Tensor written_slots(const at::Tensor& t, bool skip_first) {
  return skip_first ? t.slice(-2, 1) : t;
}
at::Tensor with_first_slot(const at::Tensor& t, const at::Tensor& written, bool skip_first) {
  return skip_first ? at::cat({t.slice(-2, 0, 1), written}, -2) : written;
}

struct InjectionResidualFunction : torch::autograd::Function<InjectionResidualFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& delta,
                            bool skip_first) {
    const c10::cuda::CUDAGuard guard(h.device());
    const auto hc = h.contiguous(), dc = delta.contiguous();
    auto written = launch_forward(hc, dc, skip_first);
    ctx->save_for_backward({hc, dc, written.rms});
    ctx->saved_data["skip_first"] = skip_first;
    return written.out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const c10::cuda::CUDAGuard guard(saved[0].device());
    auto [grad_h, grad_delta] =
        launch_backward(grads[0].contiguous(), saved[0], saved[1], saved[2], at::Tensor(),
                        ctx->saved_data["skip_first"].toBool());
    return {grad_h, grad_delta, at::Tensor()};
  }
};

// The write by the kernels and out_r = r + rms · delta_r beside it (r-space, ATen, fp32 then one
// rounding). Backward: d delta_r = rms · g_r, d r = g_r, and Σ g_r · delta_r per row joins the
// kernel's Σ g · delta as the derivative by rms.
struct InjectionResidualReadoutFunction
    : torch::autograd::Function<InjectionResidualReadoutFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& delta,
                               const at::Tensor& r, const at::Tensor& delta_r, bool skip_first) {
    const c10::cuda::CUDAGuard guard(h.device());
    const auto hc = h.contiguous(), dc = delta.contiguous();
    auto written = launch_forward(hc, dc, skip_first);
    const auto scale = written_slots(row_scale(written.rms, r), skip_first);
    const auto out_r = with_first_slot(
        r,
        (written_slots(r, skip_first).to(at::kFloat) + scale * delta_r.to(at::kFloat))
            .to(r.scalar_type()),
        skip_first);
    ctx->save_for_backward({hc, dc, written.rms, delta_r});
    ctx->saved_data["skip_first"] = skip_first;
    return {written.out, out_r};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &h = saved[0], &delta = saved[1], &rms = saved[2], &delta_r = saved[3];
    const bool skip_first = ctx->saved_data["skip_first"].toBool();
    const c10::cuda::CUDAGuard guard(h.device());
    const auto &grad = grads[0], &grad_r = grads[1];
    at::Tensor extra_dot, grad_delta_r;
    if (grad_r.defined()) {
      const auto written_grad = written_slots(grad_r, skip_first).to(at::kFloat);
      const auto dots = (written_grad * delta_r.to(at::kFloat)).sum(-1, /*keepdim=*/true);
      extra_dot = at::zeros_like(row_scale(rms, grad_r));
      written_slots(extra_dot, skip_first).copy_(dots);
      grad_delta_r = (written_slots(row_scale(rms, grad_r), skip_first) * written_grad)
                         .to(delta_r.scalar_type());
    }
    auto [grad_h, grad_delta] =
        launch_backward(grad.defined() ? grad.contiguous() : at::zeros_like(h), h, delta, rms,
                        extra_dot.defined() ? extra_dot.reshape({-1}) : extra_dot, skip_first);
    return {grad_h, grad_delta, grad_r, grad_delta_r, at::Tensor()};
  }

  // rms [rows] as [..., T, 1] against t [..., T, R].
  static at::Tensor row_scale(const at::Tensor& rms, const at::Tensor& t) {
    auto shape = t.sizes().vec();
    shape.back() = 1;
    return rms.view(shape);
  }
};

}  // namespace

namespace {
// rms of the written slots accumulated in fp32 (fp64 for fp64 h) without a widened copy of h,
// rounded to h's dtype: [..., T(−1), 1].
at::Tensor written_rms(const at::Tensor& written) {
  const auto accumulate = at::promote_types(at::kFloat, written.scalar_type());
  return (at::linalg_vector_norm(written, 2, {-1}, true, accumulate) /
          std::sqrt(static_cast<double>(written.size(-1))))
      .to(written.scalar_type());
}
}  // namespace

at::Tensor injection_residual_reference(const at::Tensor& h, const at::Tensor& delta,
                                        bool skip_first) {
  const auto written = written_slots(h, skip_first);
  return with_first_slot(h, written + written_rms(written) * delta, skip_first);
}

std::pair<at::Tensor, at::Tensor> injection_residual_readout_reference(const at::Tensor& h,
                                                                       const at::Tensor& delta,
                                                                       const at::Tensor& r,
                                                                       const at::Tensor& delta_r,
                                                                       bool skip_first) {
  const auto written = written_slots(h, skip_first);
  const auto rms = written_rms(written);
  return {with_first_slot(h, written + rms * delta, skip_first),
          with_first_slot(r, written_slots(r, skip_first) + rms.to(r.scalar_type()) * delta_r,
                          skip_first)};
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

bool injection_residual_readout_fusable(const at::Tensor& h, const at::Tensor& delta,
                                        const at::Tensor& r, const at::Tensor& delta_r,
                                        bool skip_first) {
  if (!injection_residual_fusable(h, delta, skip_first) || r.dim() != h.dim() ||
      !shapes_pair(r, delta_r, skip_first)) {
    return false;
  }
  for (const auto* t : {&r, &delta_r}) {
    if (t->device() != h.device() || t->scalar_type() != h.scalar_type()) return false;
  }
  return r.sizes().slice(0, r.dim() - 1) == h.sizes().slice(0, h.dim() - 1);
}

std::pair<at::Tensor, at::Tensor> injection_residual_readout_fused(const at::Tensor& h,
                                                                   const at::Tensor& delta,
                                                                   const at::Tensor& r,
                                                                   const at::Tensor& delta_r,
                                                                   bool skip_first) {
  if (!injection_residual_readout_fusable(h, delta, r, delta_r, skip_first)) {
    fail(
        "fused injection residual with readout: h {} {} on {}, delta {}, r {} {}, delta_r {} "
        "(skip_first {}) are not taken: the residual's rules, and r, delta_r of h's dtype and "
        "device with r's rows h's and delta_r paired with r as delta with h",
        c10::toString(h.scalar_type()), c10::str(h.sizes()), h.device().str(),
        c10::str(delta.sizes()), c10::toString(r.scalar_type()), c10::str(r.sizes()),
        c10::str(delta_r.sizes()), skip_first);
  }
  auto outputs = InjectionResidualReadoutFunction::apply(h, delta, r, delta_r, skip_first);
  return {outputs[0], outputs[1]};
}

}  // namespace dspine::ops
