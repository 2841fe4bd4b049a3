#include "ops/candidate_scores_ops.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/autograd.h>

#include "core/error.h"
#include "kernels/candidate_scores.h"
#include "ops/kernel_launch.h"

namespace dspine::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

kernels::CandidateRows kernel_rows(const at::Tensor& table, const at::Tensor& candidates) {
  kernels::CandidateRows rows;
  rows.k = candidates.size(-1);
  rows.rows = candidates.numel() / rows.k;
  rows.hidden = table.size(1);
  rows.vocab = table.size(0);
  return rows;
}

struct CandidateScoresFunction : torch::autograd::Function<CandidateScoresFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& table,
                            const at::Tensor& candidates, const at::Tensor& x) {
    const c10::cuda::CUDAGuard guard(x.device());
    auto scores = at::empty(candidates.sizes(), x.options().dtype(at::kFloat));
    check_launch(kernels::candidate_scores_forward(
                     table.data_ptr(), candidates.data_ptr<int64_t>(), x.data_ptr(),
                     scores.data_ptr<float>(), kernel_rows(table, candidates),
                     at::cuda::getCurrentCUDAStream()),
                 "candidate scores forward", x);
    ctx->save_for_backward({table, candidates});
    ctx->saved_data["x_sizes"] = x.sizes();
    return scores;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &table = saved[0], &candidates = saved[1];
    const c10::cuda::CUDAGuard guard(table.device());
    const auto grad = grads[0].contiguous().to(at::kFloat);
    auto grad_x = at::empty(ctx->saved_data["x_sizes"].toIntVector(), table.options());
    check_launch(kernels::candidate_scores_backward(
                     grad.data_ptr<float>(), table.data_ptr(), candidates.data_ptr<int64_t>(),
                     grad_x.data_ptr(), kernel_rows(table, candidates),
                     at::cuda::getCurrentCUDAStream()),
                 "candidate scores backward", table);
    return {at::Tensor(), at::Tensor(), grad_x};
  }
};

}  // namespace

at::Tensor candidate_scores_reference(const at::Tensor& table, const at::Tensor& candidates,
                                      const at::Tensor& x) {
  return at::embedding(table, candidates).matmul(x.unsqueeze(-1)).squeeze(-1).to(at::kFloat);
}

bool candidate_scores_fusable(const at::Tensor& table, const at::Tensor& candidates,
                              const at::Tensor& x) {
  return x.is_cuda() && table.device() == x.device() && candidates.device() == x.device() &&
         x.scalar_type() == at::kBFloat16 && table.scalar_type() == at::kBFloat16 &&
         table.dim() == 2 && !table.requires_grad() && candidates.scalar_type() == at::kLong &&
         candidates.dim() == x.dim() && x.dim() >= 1 &&
         candidates.sizes().slice(0, x.dim() - 1) == x.sizes().slice(0, x.dim() - 1) &&
         x.size(-1) == table.size(1) &&
         kernels::candidate_scores_supported(candidates.size(-1), x.size(-1));
}

at::Tensor candidate_scores_fused(const at::Tensor& table, const at::Tensor& candidates,
                                  const at::Tensor& x) {
  if (!candidate_scores_fusable(table, candidates, x)) {
    fail(
        "candidate scores: the kernels do not take table {} {} on {} (requires grad: {}), "
        "candidates {} {} and x {} {} on {}",
        c10::toString(table.scalar_type()), c10::str(table.sizes()), table.device().str(),
        table.requires_grad(), c10::toString(candidates.scalar_type()),
        c10::str(candidates.sizes()), c10::toString(x.scalar_type()), c10::str(x.sizes()),
        x.device().str());
  }
  // The kernels read 16-byte packs of contiguous rows.
  const auto packed = [](const at::Tensor& t) {
    return t.is_contiguous() && aligned16(t) ? t : t.clone(at::MemoryFormat::Contiguous);
  };
  return CandidateScoresFunction::apply(packed(table), candidates.contiguous(), packed(x));
}

}  // namespace dspine::ops
