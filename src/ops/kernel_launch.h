// Shared glue between tensors and the fused kernels: dtype mapping, alignment and launch checks.
#pragma once

#include <cuda_runtime_api.h>

#include <ATen/core/Tensor.h>

#include "kernels/norm_swiglu_types.h"

namespace dspine::ops {

// The kernels' element type for `type`; false when the kernels do not take it (e.g. fp64).
bool kernel_dtype(at::ScalarType type, kernels::DType* out);

// Whether t's data starts on a 16-byte boundary, as the kernels' 16-byte packs need.
bool aligned16(const at::Tensor& t);

// Throws dspine::Error naming the kernel, the input's shape and dtype when a launch failed.
void check_launch(cudaError_t status, const char* what, const at::Tensor& input);

}  // namespace dspine::ops
