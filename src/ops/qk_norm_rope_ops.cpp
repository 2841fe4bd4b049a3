#include "ops/qk_norm_rope_ops.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/torch.h>

#include <initializer_list>
#include <utility>

#include "core/error.h"
#include "kernels/qk_norm_rope.h"
#include "ops/kernel_launch.h"
#include "ops/rms_norm_ops.h"

namespace dspine::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool strides_of_16_bytes(const at::Tensor& t, std::initializer_list<int64_t> dims) {
  for (int64_t dim : dims) {
    if (t.stride(dim) * t.element_size() % 16 != 0) return false;
  }
  return true;
}

// A contiguous, 16-byte aligned copy of t unless it already is one.
at::Tensor contiguous_aligned(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return aligned16(c) ? c : c.clone();
}

// x as the kernels read it: head vectors contiguous, rows (b, p) evenly strided and 16-byte
// aligned. A slice of a wider projection (a fused qkv GEMM) is read in place.
at::Tensor readable_x(const at::Tensor& x) {
  const bool in_place =
      x.stride(3) == 1 && x.stride(2) == x.size(3) && x.stride(0) == x.size(1) * x.stride(1) &&
      x.stride(1) >= x.size(2) * x.size(3) && strides_of_16_bytes(x, {1}) && aligned16(x);
  return in_place ? x : contiguous_aligned(x);
}

// The last P positions of the tables, in place when both share 16-byte strides and alignment.
std::pair<at::Tensor, at::Tensor> readable_tables(const at::Tensor& cos, const at::Tensor& sin,
                                                  int64_t positions) {
  at::Tensor c = cos.slice(1, cos.size(1) - positions);
  at::Tensor s = sin.slice(1, sin.size(1) - positions);
  auto readable = [](const at::Tensor& t) {
    return t.stride(2) == 1 && strides_of_16_bytes(t, {0, 1}) && aligned16(t);
  };
  if (c.strides() != s.strides() || !readable(c) || !readable(s)) {
    c = contiguous_aligned(c);
    s = contiguous_aligned(s);
  }
  return {c, s};
}

// The kernels' view of readable x and tables.
struct Launch {
  kernels::QkNormRopeShape shape;
  kernels::RopeTableView rope;
  kernels::DType dtype = kernels::DType::kFloat32;
};

Launch launch_of(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  Launch l;
  l.shape.batch = x.size(0);
  l.shape.positions = x.size(1);
  l.shape.heads = x.size(2);
  l.shape.head_dim = x.size(3);
  l.shape.x_row_stride = x.stride(1);
  l.rope.cos = cos.data_ptr();
  l.rope.sin = sin.data_ptr();
  l.rope.batch_stride = cos.stride(0);
  l.rope.position_stride = cos.stride(1);
  kernel_dtype(x.scalar_type(), &l.dtype);
  return l;
}

struct QkNormRopeFunction : public torch::autograd::Function<QkNormRopeFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            double eps, const at::Tensor& cos, const at::Tensor& sin) {
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor xr = readable_x(x);
    const auto [c, s] = readable_tables(cos, sin, x.size(1));
    const at::Tensor w = contiguous_aligned(weight);
    const Launch l = launch_of(xr, c, s);
    at::Tensor out = at::empty(x.sizes(), x.options());
    at::Tensor rstd = at::empty({x.size(0) * x.size(1) * x.size(2)}, x.options().dtype(at::kFloat));
    check_launch(kernels::qk_norm_rope_forward(l.shape, xr.data_ptr(), w.data_ptr(), l.rope,
                                               float(eps), out.data_ptr(), rstd.data_ptr<float>(),
                                               l.dtype, at::cuda::getCurrentCUDAStream()),
                 "q/k RMSNorm + RoPE forward", x);
    ctx->save_for_backward({xr, w, rstd, c, s});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &rstd = saved[2], &c = saved[3], &s = saved[4];
    const c10::cuda::CUDAGuard guard(x.device());
    const Launch l = launch_of(x, c, s);
    const at::Tensor grad = contiguous_aligned(grads[0]);
    at::Tensor dx = at::empty(x.sizes(), x.options());
    at::Tensor partials = at::empty({kernels::qk_norm_rope_backward_ctas(l.shape), x.size(3)},
                                    x.options().dtype(at::kFloat));
    check_launch(kernels::qk_norm_rope_backward(l.shape, grad.data_ptr(), x.data_ptr(),
                                                w.data_ptr(), rstd.data_ptr<float>(), l.rope,
                                                dx.data_ptr(), partials.data_ptr<float>(), l.dtype,
                                                at::cuda::getCurrentCUDAStream()),
                 "q/k RMSNorm + RoPE backward", x);
    at::Tensor dweight = partials.sum(0).to(w.scalar_type());
    return {dx, dweight, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor rope_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t rows = x.size(1);
  const int64_t half = x.size(-1) / 2;
  const at::Tensor c = cos.slice(1, cos.size(1) - rows).unsqueeze(2);
  const at::Tensor s = sin.slice(1, sin.size(1) - rows).unsqueeze(2);
  const at::Tensor rotated = at::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
  return x * c + rotated * s;
}

at::Tensor qk_norm_rope_reference(const at::Tensor& x, const at::Tensor& weight, double eps,
                                  const at::Tensor& cos, const at::Tensor& sin) {
  return rope_reference(rms_norm_reference(x, weight, eps), cos, sin);
}

bool qk_norm_rope_fusable(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos,
                          const at::Tensor& sin) {
  kernels::DType dtype = kernels::DType::kFloat32;
  if (!x.is_cuda() || x.dim() != 4 || !kernel_dtype(x.scalar_type(), &dtype)) return false;
  auto same_kind = [&](const at::Tensor& t) {
    return t.scalar_type() == x.scalar_type() && t.device() == x.device();
  };
  auto table = [&](const at::Tensor& t) {
    return same_kind(t) && !t.requires_grad() && t.dim() == 3 && t.size(0) == x.size(0) &&
           t.size(1) >= x.size(1) && t.size(2) == x.size(3);
  };
  kernels::QkNormRopeShape contiguous;
  contiguous.batch = x.size(0);
  contiguous.positions = x.size(1);
  contiguous.heads = x.size(2);
  contiguous.head_dim = x.size(3);
  contiguous.x_row_stride = x.size(2) * x.size(3);
  return kernels::qk_norm_rope_supported(contiguous, dtype) && same_kind(weight) &&
         weight.dim() == 1 && weight.size(0) == x.size(3) && table(cos) && table(sin);
}

at::Tensor qk_norm_rope(const at::Tensor& x, const at::Tensor& weight, double eps,
                        const at::Tensor& cos, const at::Tensor& sin) {
  if (!qk_norm_rope_fusable(x, weight, cos, sin)) {
    fail(
        "fused q/k RMSNorm + RoPE needs CUDA fp32/fp16/bf16 x [B, P, heads, D] with D 64 or 128, "
        "weight [D] and cos/sin [B, >= P, D] (no grad) of x's dtype on x's device; got x {} {} on "
        "{}, weight {} {} on {}, cos {} {} on {}, sin {} {} on {}",
        c10::str(x.sizes()), c10::toString(x.scalar_type()), x.device().str(),
        c10::str(weight.sizes()), c10::toString(weight.scalar_type()), weight.device().str(),
        c10::str(cos.sizes()), c10::toString(cos.scalar_type()), cos.device().str(),
        c10::str(sin.sizes()), c10::toString(sin.scalar_type()), sin.device().str());
  }
  return QkNormRopeFunction::apply(x, weight, eps, cos, sin);
}

}  // namespace dspine::ops
