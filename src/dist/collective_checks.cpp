#include "dist/collective_checks.h"

#include <ATen/ATen.h>

#include "core/error.h"

namespace dspine::dist {

void require_contiguous_on(const at::Tensor& tensor, const c10::Device& device,
                           const char* backend, const char* what) {
  if (tensor.device() != device || !tensor.is_contiguous()) {
    fail("{} {}: needs a contiguous tensor on {} (got a {} tensor on {})", backend, what,
         device.str(), tensor.is_contiguous() ? "contiguous" : "non-contiguous",
         tensor.device().str());
  }
}

void check_gather_sizes(const at::Tensor& input, const at::Tensor& output, int world_size,
                        const char* backend) {
  if (output.nbytes() != input.nbytes() * static_cast<size_t>(world_size)) {
    fail("{} all_gather: output has {} bytes, expected {} ranks x {} bytes", backend,
         output.nbytes(), world_size, input.nbytes());
  }
}

void check_scatter_sizes(const at::Tensor& input, const at::Tensor& output, int world_size,
                         const char* backend) {
  if (input.scalar_type() != output.scalar_type() ||
      input.numel() != output.numel() * world_size) {
    fail("{} reduce_scatter: input is {} x {}, expected {} ranks x {} elements of {}", backend,
         input.numel(), c10::toString(input.scalar_type()), world_size, output.numel(),
         c10::toString(output.scalar_type()));
  }
}

void check_reduce_op(const at::Tensor& tensor, ReduceOp op, const char* backend,
                     const char* what) {
  if (op == ReduceOp::kAvg && !at::isFloatingType(tensor.scalar_type())) {
    fail("{} {}: ReduceOp::kAvg needs a floating-point tensor (got {}); sum and divide instead",
         backend, what, c10::toString(tensor.scalar_type()));
  }
}

}  // namespace dspine::dist
