#include "ops/attention_projections.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "core/error.h"

namespace dspine::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// out = a·weightᵀ, or out += a·weightᵀ when accumulating: 2-D, out a contiguous slice of a wider
// tensor (the GEMM writes it in place; with accumulate, β = 1 reads it in the epilogue).
void project_into(at::Tensor out, const at::Tensor& a, const at::Tensor& weight, bool accumulate) {
  if (accumulate) {
    out.addmm_(a, weight.t());
  } else {
    at::mm_out(out, a, weight.t());
  }
}

// out (+)= aᵀ·b for a [rows, M], b [rows, N]: a weight gradient, summed over calls in the GEMM.
void weight_gradient_into(at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  if (out.defined()) {
    out.addmm_(a.t(), b);
  } else {
    out = at::mm(a.t(), b);
  }
}

struct AttentionProjectionsFunction
    : public torch::autograd::Function<AttentionProjectionsFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& context,
                               const at::Tensor& q_weight, const at::Tensor& k_weight,
                               const at::Tensor& v_weight) {
    const int64_t rows = x.size(0), queries = x.size(1), positions = context.size(1);
    ctx->save_for_backward({x, context, q_weight, k_weight, v_weight});
    at::Tensor q = at::matmul(x, q_weight.t());
    at::Tensor k = at::empty({rows, positions + queries, k_weight.size(0)}, x.options());
    at::Tensor v = at::empty({rows, positions + queries, v_weight.size(0)}, x.options());
    // Per row: the context's and the block tokens' projections are contiguous slices of k and v,
    // so each GEMM writes its part in place (no concatenation).
    for (int64_t r = 0; r < rows; ++r) {
      for (auto [out, weight] : {std::pair{k[r], &k_weight}, std::pair{v[r], &v_weight}}) {
        project_into(out.narrow(0, 0, positions), context[r], *weight, false);
        project_into(out.narrow(0, positions, queries), x[r], *weight, false);
      }
    }
    return {q, k, v};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &context = saved[1];
    const at::Tensor &q_weight = saved[2], &k_weight = saved[3], &v_weight = saved[4];
    const int64_t rows = x.size(0), queries = x.size(1), positions = context.size(1);
    const at::Tensor dq = grads[0].contiguous();
    const at::Tensor dk = grads[1].contiguous(), dv = grads[2].contiguous();
    at::Tensor dx, dcontext, dq_weight, dk_weight, dv_weight;
    if (ctx->needs_input_grad(0)) dx = at::matmul(dq, q_weight);
    if (ctx->needs_input_grad(1)) dcontext = at::empty_like(context);
    for (int64_t r = 0; r < rows; ++r) {
      const at::Tensor dk_context = dk[r].narrow(0, 0, positions);
      const at::Tensor dv_context = dv[r].narrow(0, 0, positions);
      const at::Tensor dk_blocks = dk[r].narrow(0, positions, queries);
      const at::Tensor dv_blocks = dv[r].narrow(0, positions, queries);
      if (dx.defined()) {
        project_into(dx[r], dk_blocks, k_weight.t(), true);
        project_into(dx[r], dv_blocks, v_weight.t(), true);
      }
      if (dcontext.defined()) {
        project_into(dcontext[r], dk_context, k_weight.t(), false);
        project_into(dcontext[r], dv_context, v_weight.t(), true);
      }
      if (ctx->needs_input_grad(3)) {
        weight_gradient_into(dk_weight, dk_context, context[r]);
        weight_gradient_into(dk_weight, dk_blocks, x[r]);
      }
      if (ctx->needs_input_grad(4)) {
        weight_gradient_into(dv_weight, dv_context, context[r]);
        weight_gradient_into(dv_weight, dv_blocks, x[r]);
      }
    }
    if (ctx->needs_input_grad(2)) {
      dq_weight = at::mm(dq.reshape({-1, dq.size(-1)}).t(), x.reshape({-1, x.size(-1)}));
    }
    return {dx, dcontext, dq_weight, dk_weight, dv_weight};
  }
};

}  // namespace

AttentionProjections attention_projections(const at::Tensor& x, const at::Tensor& context,
                                           const at::Tensor& q_weight, const at::Tensor& k_weight,
                                           const at::Tensor& v_weight) {
  const bool shapes_match = x.dim() == 3 && context.dim() == 3 && x.size(0) == context.size(0) &&
                            x.size(2) == context.size(2) && q_weight.dim() == 2 &&
                            k_weight.dim() == 2 && v_weight.dim() == 2 &&
                            q_weight.size(1) == x.size(2) && k_weight.size(1) == x.size(2) &&
                            v_weight.size(1) == x.size(2);
  if (!shapes_match) {
    fail(
        "attention projections need x [B, Q, H], context [B, S, H] and weights [·, H]; got x {}, "
        "context {}, q {}, k {}, v {}",
        c10::str(x.sizes()), c10::str(context.sizes()), c10::str(q_weight.sizes()),
        c10::str(k_weight.sizes()), c10::str(v_weight.sizes()));
  }
  auto outputs = AttentionProjectionsFunction::apply(x.contiguous(), context.contiguous(), q_weight,
                                                     k_weight, v_weight);
  return {outputs[0], outputs[1], outputs[2]};
}

}  // namespace dspine::ops
