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

Written launch_forward(const at::Tensor& h, const at::Tensor& delta, bool skip_first,
                       const kernels::InjectionReadout* readout = nullptr) {
  const auto shape = kernel_rows(h, skip_first);
  Written w{at::empty_like(h), at::empty({shape.rows}, h.options().dtype(at::kFloat))};
  check_launch(kernels::injection_residual_forward(h.data_ptr(), delta.data_ptr(), w.out.data_ptr(),
                                                   w.rms.data_ptr<float>(), shape,
                                                   at::cuda::getCurrentCUDAStream(), readout),
               "injection residual forward", h);
  return w;
}

// {dh, ddelta}.
std::pair<at::Tensor, at::Tensor> launch_backward(
    const at::Tensor& grad, const at::Tensor& h, const at::Tensor& delta, const at::Tensor& rms,
    bool skip_first, const kernels::InjectionReadout* readout = nullptr) {
  auto grad_h = at::empty_like(h);
  auto grad_delta = at::empty_like(delta);
  check_launch(kernels::injection_residual_backward(
                   grad.data_ptr(), h.data_ptr(), delta.data_ptr(), rms.data_ptr<float>(),
                   grad_h.data_ptr(), grad_delta.data_ptr(), kernel_rows(h, skip_first),
                   at::cuda::getCurrentCUDAStream(), readout),
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
    auto [grad_h, grad_delta] = launch_backward(grads[0].contiguous(), saved[0], saved[1], saved[2],
                                                ctx->saved_data["skip_first"].toBool());
    return {grad_h, grad_delta, at::Tensor()};
  }
};

// The write by the kernels and out_r = r + rms · delta_r beside it (r-space, ATen, fp32 then one
// rounding). Backward: d delta_r = rms · g_r, d r = g_r, and Σ g_r · delta_r per row joins the
// kernel's Σ g · delta as the derivative by rms.
// The write with the readout rows of the same kernels: out_r = r + rms · delta_r forward;
// backward d delta_r = rms · g_r and Σ g_r · delta_r joining the derivative by rms, while r's
// gradient is g_r itself.
struct InjectionResidualReadoutFunction
    : torch::autograd::Function<InjectionResidualReadoutFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& delta,
                               const at::Tensor& r, const at::Tensor& delta_r, bool skip_first) {
    const c10::cuda::CUDAGuard guard(h.device());
    const auto hc = h.contiguous(), dc = delta.contiguous();
    const auto rc = r.contiguous(), drc = delta_r.contiguous();
    auto out_r = at::empty_like(rc);
    kernels::InjectionReadout readout;
    readout.width = rc.size(-1);
    readout.r = rc.data_ptr();
    readout.delta_r = drc.data_ptr();
    readout.out_r = out_r.data_ptr();
    auto written = launch_forward(hc, dc, skip_first, &readout);
    ctx->save_for_backward({hc, dc, written.rms, drc});
    ctx->saved_data["skip_first"] = skip_first;
    return {written.out, out_r};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &h = saved[0], &delta_r = saved[3];
    const c10::cuda::CUDAGuard guard(h.device());
    const auto grad_r = grads[1].defined() ? grads[1].contiguous() : at::Tensor();
    at::Tensor grad_delta_r;
    kernels::InjectionReadout readout;
    readout.width = delta_r.size(-1);
    readout.delta_r = delta_r.data_ptr();
    if (grad_r.defined()) {
      grad_delta_r = at::empty_like(delta_r);
      readout.grad_r = grad_r.data_ptr();
      readout.grad_delta_r = grad_delta_r.data_ptr();
    }
    auto [grad_h, grad_delta] =
        launch_backward(grads[0].defined() ? grads[0].contiguous() : at::zeros_like(h), h, saved[1],
                        saved[2], ctx->saved_data["skip_first"].toBool(), &readout);
    return {grad_h, grad_delta, grad_r, grad_delta_r, at::Tensor()};
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
  kernels::DType type = kernels::DType::kFloat32;
  kernel_dtype(h.scalar_type(), &type);
  return r.sizes().slice(0, r.dim() - 1) == h.sizes().slice(0, h.dim() - 1) &&
         kernels::injection_readout_supported(r.size(-1), type);
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
