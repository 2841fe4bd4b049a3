#include "ops/cosine_alignment_ops.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/autograd.h>

#include "core/error.h"
#include "kernels/cosine_alignment.h"
#include "ops/kernel_launch.h"

namespace dspine::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool shapes_pair(const at::Tensor& features, const at::Tensor& codes) {
  return features.dim() == 4 && codes.dim() == 3 && codes.size(0) == features.size(0) &&
         codes.size(1) == features.size(2) && codes.size(2) == features.size(3);
}

kernels::AlignmentRows kernel_rows(const at::Tensor& features, double eps) {
  kernels::AlignmentRows rows;
  rows.blocks = features.size(0);
  rows.layers = features.size(1);
  rows.positions = features.size(2);
  rows.rank = features.size(3);
  rows.block_stride = features.stride(0);
  rows.layer_stride = features.stride(1);
  rows.position_stride = features.stride(2);
  rows.eps = static_cast<float>(eps);
  kernel_dtype(features.scalar_type(), &rows.type);
  return rows;
}

struct CosineAlignmentFunction : torch::autograd::Function<CosineAlignmentFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& features,
                            const at::Tensor& codes, double eps) {
    const c10::cuda::CUDAGuard guard(features.device());
    const auto shape = kernel_rows(features, eps);
    auto cosine = at::empty({shape.blocks, shape.layers, shape.positions},
                            features.options().dtype(at::kFloat));
    check_launch(kernels::cosine_alignment_forward(features.data_ptr(), codes.data_ptr<float>(),
                                                   cosine.data_ptr<float>(), shape,
                                                   at::cuda::getCurrentCUDAStream()),
                 "cosine alignment forward", features);
    ctx->save_for_backward({features, codes});
    ctx->saved_data["eps"] = eps;
    return cosine;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &features = saved[0], &codes = saved[1];
    const c10::cuda::CUDAGuard guard(features.device());
    const auto grad = grads[0].contiguous().to(at::kFloat);
    auto grad_features = at::empty(features.sizes(), features.options());
    check_launch(
        kernels::cosine_alignment_backward(grad.data_ptr<float>(), features.data_ptr(),
                                           codes.data_ptr<float>(), grad_features.data_ptr(),
                                           kernel_rows(features, ctx->saved_data["eps"].toDouble()),
                                           at::cuda::getCurrentCUDAStream()),
        "cosine alignment backward", features);
    return {grad_features, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor cosine_alignment_reference(const at::Tensor& features, const at::Tensor& codes,
                                      double eps) {
  return at::cosine_similarity(features.to(at::kFloat), codes.unsqueeze(1), -1, eps);
}

bool cosine_alignment_fusable(const at::Tensor& features, const at::Tensor& codes) {
  kernels::DType type;
  return features.is_cuda() && codes.device() == features.device() &&
         shapes_pair(features, codes) && kernel_dtype(features.scalar_type(), &type) &&
         kernels::cosine_alignment_supported(features.size(3), type) && features.stride(3) == 1 &&
         codes.scalar_type() == at::kFloat && !codes.requires_grad();
}

at::Tensor cosine_alignment_fused(const at::Tensor& features, const at::Tensor& codes, double eps) {
  if (!cosine_alignment_fusable(features, codes)) {
    fail("cosine alignment: the kernels do not take features {} {} on {} with codes {} {} on {}",
         c10::toString(features.scalar_type()), c10::str(features.sizes()), features.device().str(),
         c10::toString(codes.scalar_type()), c10::str(codes.sizes()), codes.device().str());
  }
  // Rows (and their strides) in 16-byte packs: a misaligned view is copied first.
  const auto aligned = [](const at::Tensor& t) {
    const bool packs = aligned16(t) &&
                       t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0 &&
                       (t.dim() < 4 || t.stride(2) % 8 == 0);
    return packs ? t : t.clone(at::MemoryFormat::Contiguous);
  };
  return CosineAlignmentFunction::apply(aligned(features), aligned(codes.contiguous()), eps);
}

}  // namespace dspine::ops
