// Two 2-D tensors as one [rows₁ + rows₂, cols] tensor for one GEMM (the SwiGLU's gate and up
// weights): a view when the second's rows follow the first's in one buffer, as a sharding unit lays
// a module's parameters out, else a concatenation. Either way the gradient splits back by rows.
#pragma once

#include <ATen/core/Tensor.h>

namespace dspine::ops {

// Whether `first` and `second` are contiguous [·, cols] of one dtype with second's rows directly
// after first's in the same storage.
bool rows_adjacent(const at::Tensor& first, const at::Tensor& second);

// cat({first, second}, 0), without the copy when rows_adjacent (a view through an autograd
// function whose backward hands each input its rows of the gradient).
at::Tensor adjacent_rows(const at::Tensor& first, const at::Tensor& second);

}  // namespace dspine::ops
