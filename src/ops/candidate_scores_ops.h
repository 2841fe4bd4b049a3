// The refinement head's scores of its top-k vocabulary candidates (docs/model.md, "Objective"):
// the ATen reference, which gathers the candidates' rows of the LM head, and an autograd function
// over kernels/candidate_scores, which reads them in place.
#pragma once

#include <ATen/core/Tensor.h>

namespace dspine::ops {

// table [V, H] (the LM head), candidates [..., k] int64 ids, x [..., H] (the refined states) →
// scores [..., k] fp32, scores[..., j] = <table[candidates[..., j]], x[...]>.
at::Tensor candidate_scores_reference(const at::Tensor& table, const at::Tensor& candidates,
                                      const at::Tensor& x);

// Whether the kernels take these: CUDA bf16 x and table on one device, a table without gradient,
// int64 candidates whose leading dims are x's, k ≤ 32 and H a multiple of 8.
bool candidate_scores_fusable(const at::Tensor& table, const at::Tensor& candidates,
                              const at::Tensor& x);

// The same scores through the kernels; the gradient reaches x only, and only the table and the
// candidates are kept for it.
at::Tensor candidate_scores_fused(const at::Tensor& table, const at::Tensor& candidates,
                                  const at::Tensor& x);

}  // namespace dspine::ops
