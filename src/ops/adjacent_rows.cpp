#include "ops/adjacent_rows.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

namespace dspine::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct AdjacentRowsFunction : torch::autograd::Function<AdjacentRowsFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& first,
                            const at::Tensor& second) {
    ctx->saved_data["rows"] = first.size(0);
    return first.as_strided({first.size(0) + second.size(0), first.size(1)}, first.strides(),
                            first.storage_offset());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t rows = ctx->saved_data["rows"].toInt();
    const auto& grad = grads[0];
    return {grad.narrow(0, 0, rows), grad.narrow(0, rows, grad.size(0) - rows)};
  }
};

}  // namespace

bool rows_adjacent(const at::Tensor& first, const at::Tensor& second) {
  return first.dim() == 2 && second.dim() == 2 && first.size(1) == second.size(1) &&
         first.is_contiguous() && second.is_contiguous() &&
         first.scalar_type() == second.scalar_type() && first.is_alias_of(second) &&
         second.storage_offset() == first.storage_offset() + first.numel();
}

at::Tensor adjacent_rows(const at::Tensor& first, const at::Tensor& second) {
  if (!rows_adjacent(first, second)) return at::cat({first, second}, 0);
  return AdjacentRowsFunction::apply(first, second);
}

}  // namespace dspine::ops
