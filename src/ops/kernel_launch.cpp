#include "ops/kernel_launch.h"

#include <c10/util/StringUtil.h>

#include <cstdint>

#include "core/error.h"

namespace dspine::ops {

bool kernel_dtype(at::ScalarType type, kernels::DType* out) {
  switch (type) {
    case at::kFloat:
      *out = kernels::DType::kFloat32;
      return true;
    case at::kHalf:
      *out = kernels::DType::kFloat16;
      return true;
    case at::kBFloat16:
      *out = kernels::DType::kBFloat16;
      return true;
    default:
      return false;
  }
}

bool aligned16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

void check_launch(cudaError_t status, const char* what, const at::Tensor& input) {
  if (status != cudaSuccess) {
    fail("{} failed for input of shape {} ({}): {}", what, c10::str(input.sizes()),
         c10::toString(input.scalar_type()), cudaGetErrorString(status));
  }
}

}  // namespace dspine::ops
