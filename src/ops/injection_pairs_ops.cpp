#include "ops/injection_pairs_ops.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/autograd.h>

#include <vector>

#include "core/error.h"
#include "kernels/injection_pairs.h"
#include "ops/kernel_launch.h"

namespace dspine::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

kernels::InjectionPairShape kernel_shape(const at::Tensor& features) {
  kernels::InjectionPairShape shape;
  shape.rank = features.size(-1);
  shape.positions = features.size(-2);
  shape.blocks = features.numel() / (shape.rank * shape.positions);
  kernel_dtype(features.scalar_type(), &shape.type);
  return shape;
}

// features' shape with `positions` in place of T.
std::vector<int64_t> with_positions(const at::Tensor& features, int64_t positions) {
  std::vector<int64_t> shape = features.sizes().vec();
  shape[shape.size() - 2] = positions;
  return shape;
}

struct InjectionPairsFunction : torch::autograd::Function<InjectionPairsFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& features,
                               const at::Tensor& anchor) {
    const c10::cuda::CUDAGuard guard(features.device());
    const auto f = features.contiguous(), a = anchor.contiguous();
    const auto shape = kernel_shape(f);
    auto receiver = at::empty(with_positions(f, shape.positions - 1), f.options());
    auto predecessor = at::empty_like(receiver);
    check_launch(kernels::injection_pairs_forward(f.data_ptr(), a.data_ptr(), receiver.data_ptr(),
                                                  predecessor.data_ptr(), shape,
                                                  at::cuda::getCurrentCUDAStream()),
                 "injection pairs forward", f);
    ctx->saved_data["features_shape"] = f.sizes().vec();
    ctx->saved_data["anchor_shape"] = a.sizes().vec();
    return {receiver, predecessor};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto features_shape = ctx->saved_data["features_shape"].toIntVector();
    const auto anchor_shape = ctx->saved_data["anchor_shape"].toIntVector();
    // An output nobody used has no gradient: it contributes zeros.
    const at::Tensor& any = grads[0].defined() ? grads[0] : grads[1];
    const auto as_grad = [&](const at::Tensor& g) {
      return g.defined() ? g.contiguous() : at::zeros_like(any, at::MemoryFormat::Contiguous);
    };
    const auto dr = as_grad(grads[0]), dp = as_grad(grads[1]);
    const c10::cuda::CUDAGuard guard(dr.device());
    auto grad_features = at::empty(features_shape, dr.options());
    auto grad_anchor = at::empty(anchor_shape, dr.options());
    check_launch(kernels::injection_pairs_backward(
                     dr.data_ptr(), dp.data_ptr(), grad_features.data_ptr(), grad_anchor.data_ptr(),
                     kernel_shape(grad_features), at::cuda::getCurrentCUDAStream()),
                 "injection pairs backward", dr);
    return {grad_features, grad_anchor};
  }
};

}  // namespace

std::pair<at::Tensor, at::Tensor> injection_pairs_reference(const at::Tensor& features,
                                                            const at::Tensor& anchor) {
  const int64_t proposals = features.size(-2) - 1;
  return {features.slice(-2, 1), at::cat({anchor, features.slice(-2, 1, proposals)}, -2)};
}

bool injection_pairs_fusable(const at::Tensor& features, const at::Tensor& anchor) {
  kernels::DType type = kernels::DType::kFloat32;
  return features.is_cuda() && features.dim() >= 2 && features.size(-2) >= 2 &&
         anchor.device() == features.device() && anchor.scalar_type() == features.scalar_type() &&
         kernel_dtype(features.scalar_type(), &type) &&
         anchor.sizes() == c10::IntArrayRef(with_positions(features, 1)) &&
         kernels::injection_pairs_supported(features.size(-1), type);
}

std::pair<at::Tensor, at::Tensor> injection_pairs_fused(const at::Tensor& features,
                                                        const at::Tensor& anchor) {
  if (!injection_pairs_fusable(features, anchor)) {
    fail(
        "fused injection pairs: features {} {} on {} and anchor {} {} on {} are not taken: CUDA "
        "fp32/fp16/bf16, features [..., T ≥ 2, r] and anchor [..., 1, r] of one dtype, r·bytes "
        "a multiple of 16",
        c10::toString(features.scalar_type()), c10::str(features.sizes()), features.device().str(),
        c10::toString(anchor.scalar_type()), c10::str(anchor.sizes()), anchor.device().str());
  }
  auto out = InjectionPairsFunction::apply(features, anchor);
  return {out[0], out[1]};
}

}  // namespace dspine::ops
