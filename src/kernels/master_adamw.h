// One AdamW step on fp32 master weights whose gradient is fp32 or the model's dtype, writing the
// model's weights in the same pass (docs/kernels.md, "Optimizer step (AdamW)"). The arithmetic is
// ATen's fused CUDA AdamW (`_fused_adamw_`, the reference this kernel is tested against) operation
// by operation, in fp32, so a step gives the same bits; what it adds is reading a bf16 gradient
// without an fp32 copy and writing the bf16 weights without a separate cast.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/norm_swiglu_types.h"

namespace dspine::kernels {

struct AdamWHyper {
  float lr = 0, beta1 = 0, beta2 = 0, weight_decay = 0, eps = 0;
  float step = 1;        // this step's count (the first step is 1)
  float grad_scale = 0;  // the gradient is divided by it (clipping); 0: not scaled
};

struct MasterAdamWTensors {
  float* master = nullptr;
  const void* grad = nullptr;  // grad_type
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  void* weights = nullptr;  // weight_type, the master rounded; null: not written
  int64_t numel = 0;
  DType grad_type = DType::kFloat32;
  DType weight_type = DType::kBFloat16;
};

// Whether the kernel takes a gradient / weights of these types (fp32 or bf16).
bool master_adamw_supported(DType grad_type, DType weight_type);

cudaError_t master_adamw_step(const MasterAdamWTensors& tensors, const AdamWHyper& hyper,
                              cudaStream_t stream);

}  // namespace dspine::kernels
