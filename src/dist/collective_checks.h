// Argument checks every back end applies before starting a collective; errors name the back end
// and the collective.
#pragma once

#include <ATen/core/Tensor.h>

#include "dist/communicator.h"

namespace dspine::dist {

// A contiguous tensor on `device` (CPU for MPI, this rank's GPU for NCCL).
void require_contiguous_on(const at::Tensor& tensor, const c10::Device& device,
                           const char* backend, const char* what);
// all_gather: output holds world_size copies of input's bytes.
void check_gather_sizes(const at::Tensor& input, const at::Tensor& output, int world_size,
                        const char* backend);
// reduce_scatter: input holds world_size × output's elements, of the same dtype.
void check_scatter_sizes(const at::Tensor& input, const at::Tensor& output, int world_size,
                         const char* backend);
// An average of integers would round differently on each back end: only floats average.
void check_reduce_op(const at::Tensor& tensor, ReduceOp op, const char* backend,
                     const char* what);

}  // namespace dspine::dist
