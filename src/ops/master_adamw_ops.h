// The tensor side of kernels/master_adamw: one sharding unit's AdamW step on the GPU, for
// MasterAdamW's fused path (train/optimizer). Torch-free callers never see the kernel's structs.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace dspine::ops {

struct AdamWStep {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, weight_decay = 0, eps = 1e-8;
  int64_t step = 1;               // the count after this step (the first step is 1)
  double clip_coefficient = 1.0;  // < 1: the gradient is multiplied by it (divided by 1 / c)
};

// One AdamW step of `master` (and its moments) from `grad`, bitwise as ATen's _fused_adamw_ on
// the fp32 gradient; `weights`, when defined, receives the updated master in its dtype (the
// publish of a unit whose state is whole). Every tensor is CUDA, contiguous and of the master's
// size: fp32 master and moments, fp32 or bf16 gradient and weights; otherwise it throws naming
// the tensor that is not, and writes nothing.
void master_adamw_step(at::Tensor& master, const at::Tensor& grad, at::Tensor& exp_avg,
                       at::Tensor& exp_avg_sq, const at::Tensor& weights, const AdamWStep& step);

}  // namespace dspine::ops
