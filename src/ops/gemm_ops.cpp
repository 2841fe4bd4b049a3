#include "ops/gemm_ops.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "kernels/gemm_sm90.h"
#include "ops/kernel_launch.h"

namespace dspine::ops {
namespace {

bool bf16_rows_on(const at::Tensor& t, const at::Device& device) {
  return t.device() == device && t.scalar_type() == at::kBFloat16 && t.dim() == 2 &&
         t.is_contiguous();
}

}  // namespace

bool own_gemm_takes(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& residual) {
  if (!x.is_cuda() || !bf16_rows_on(x, x.device()) || !bf16_rows_on(weight, x.device()) ||
      weight.size(1) != x.size(1)) {
    return false;
  }
  if (residual.defined() && (!bf16_rows_on(residual, x.device()) || residual.size(0) != x.size(0) ||
                             residual.size(1) != weight.size(0))) {
    return false;
  }
  const c10::cuda::CUDAGuard guard(x.device());
  // The output is a fresh allocation, 16-byte aligned like every caching-allocator block.
  return kernels::gemm_bf16_supported(x.data_ptr(), weight.data_ptr(), x.data_ptr(),
                                      residual.defined() ? residual.data_ptr() : nullptr, x.size(0),
                                      weight.size(0), x.size(1));
}

at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& residual) {
  if (!own_gemm_takes(x, weight, residual)) {
    auto out = at::mm(x, weight.t());
    return residual.defined() ? out.add_(residual) : out;
  }
  const c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty({x.size(0), weight.size(0)}, x.options());
  check_launch(kernels::gemm_bf16(x.data_ptr(), weight.data_ptr(), out.data_ptr(),
                                  residual.defined() ? residual.data_ptr() : nullptr, x.size(0),
                                  weight.size(0), x.size(1), at::cuda::getCurrentCUDAStream()),
               "GEMM", x);
  return out;
}

}  // namespace dspine::ops
