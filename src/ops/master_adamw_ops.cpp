#include "ops/master_adamw_ops.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/StringUtil.h>

#include "core/error.h"
#include "kernels/master_adamw.h"
#include "ops/kernel_launch.h"

namespace dspine::ops {
namespace {

bool fp32_or_bf16(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16;
}

bool flat_like(const at::Tensor& t, const at::Tensor& master) {
  return t.is_cuda() && t.is_contiguous() && t.numel() == master.numel() &&
         t.device() == master.device();
}

void require(bool ok, const char* what, const at::Tensor& t, const at::Tensor& master) {
  if (!ok) {
    fail(
        "master AdamW does not take {}: {} {} on {} (contiguous: {}); it needs contiguous CUDA "
        "tensors of the master's {} elements on {}: fp32 master and moments, fp32 or bf16 "
        "gradient and weights",
        what, c10::toString(t.scalar_type()), c10::str(t.sizes()), t.device().str(),
        t.is_contiguous(), master.numel(), master.device().str());
  }
}

}  // namespace

void master_adamw_step(at::Tensor& master, const at::Tensor& grad, at::Tensor& exp_avg,
                       at::Tensor& exp_avg_sq, const at::Tensor& weights, const AdamWStep& step) {
  require(master.is_cuda() && master.is_contiguous() && master.scalar_type() == at::kFloat,
          "the master", master, master);
  require(flat_like(grad, master) && fp32_or_bf16(grad), "the gradient", grad, master);
  for (const auto* moment : {&exp_avg, &exp_avg_sq}) {
    require(flat_like(*moment, master) && moment->scalar_type() == at::kFloat, "a moment", *moment,
            master);
  }
  if (weights.defined()) {
    require(flat_like(weights, master) && fp32_or_bf16(weights), "the weights", weights, master);
  }
  kernels::MasterAdamWTensors tensors;
  tensors.master = master.data_ptr<float>();
  tensors.grad = grad.data_ptr();
  tensors.exp_avg = exp_avg.data_ptr<float>();
  tensors.exp_avg_sq = exp_avg_sq.data_ptr<float>();
  tensors.weights = weights.defined() ? weights.data_ptr() : nullptr;
  tensors.numel = master.numel();
  kernel_dtype(grad.scalar_type(), &tensors.grad_type);
  if (weights.defined()) kernel_dtype(weights.scalar_type(), &tensors.weight_type);
  // The hyperparameters as ATen's fused kernel receives them: fp32, the step count as an fp32
  // scalar, and the clip as the fp32 scale the gradient is divided by.
  kernels::AdamWHyper hyper;
  hyper.lr = static_cast<float>(step.lr);
  hyper.beta1 = static_cast<float>(step.beta1);
  hyper.beta2 = static_cast<float>(step.beta2);
  hyper.weight_decay = static_cast<float>(step.weight_decay);
  hyper.eps = static_cast<float>(step.eps);
  hyper.step = static_cast<float>(static_cast<double>(step.step));
  hyper.grad_scale =
      step.clip_coefficient < 1.0 ? static_cast<float>(1.0 / step.clip_coefficient) : 0.0f;
  const c10::cuda::CUDAGuard guard(master.device());
  check_launch(kernels::master_adamw_step(tensors, hyper, at::cuda::getCurrentCUDAStream()),
               "master AdamW step", master);
}

}  // namespace dspine::ops
