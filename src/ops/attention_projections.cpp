#include "ops/attention_projections.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "core/error.h"
#include "ops/adjacent_rows.h"

namespace dspine::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The three weights as one [Hq·D + 2·KVH·D, H] matrix: a view when they lie one after another in
// one buffer (a sharding unit lays the q, k and v projections out so), else a copy (16 MiB at the
// recipe's size).
at::Tensor stacked_weights(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (rows_adjacent(q, k) && rows_adjacent(k, v)) {
    return q.as_strided({q.size(0) + k.size(0) + v.size(0), q.size(1)}, q.strides(),
                        q.storage_offset());
  }
  return at::cat({q, k, v}, 0);
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
        auto context_rows = out.narrow(0, 0, positions),
             block_rows = out.narrow(0, positions, queries);
        at::mm_out(context_rows, context[r], weight->t());
        at::mm_out(block_rows, x[r], weight->t());
      }
    }
    return {q, k, v};
  }

  // The gradients of the projections' outputs side by side, one row per input row: [dq | dk | dv]
  // for the block tokens and [dk | dv] for the context (one copy of each, 0.2 GiB per layer at
  // the recipe's size). Each input gradient is then one GEMM against the stacked weights and the
  // weights' gradient one GEMM per input, all over every row at once and summed in their fp32
  // accumulators: 4 GEMMs per layer instead of 18 row-sized ones.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &context = saved[1];
    const at::Tensor &q_weight = saved[2], &k_weight = saved[3], &v_weight = saved[4];
    const int64_t queries = x.size(1), positions = context.size(1), hidden = x.size(2);
    const int64_t q_width = q_weight.size(0), kv_width = k_weight.size(0);
    const at::Tensor& dq = grads[0];
    const at::Tensor &dk = grads[1], &dv = grads[2];
    const at::Tensor weights = stacked_weights(q_weight, k_weight, v_weight);
    const at::Tensor block_grads =
        at::cat({dq, dk.narrow(1, positions, queries), dv.narrow(1, positions, queries)}, 2)
            .view({-1, q_width + 2 * kv_width});
    const at::Tensor context_grads =
        at::cat({dk.narrow(1, 0, positions), dv.narrow(1, 0, positions)}, 2)
            .view({-1, 2 * kv_width});
    at::Tensor dx, dcontext, dq_weight, dk_weight, dv_weight;
    if (ctx->needs_input_grad(0)) dx = block_grads.mm(weights).view(x.sizes());
    if (ctx->needs_input_grad(1)) {
      dcontext = context_grads.mm(weights.narrow(0, q_width, 2 * kv_width)).view(context.sizes());
    }
    if (ctx->needs_input_grad(2) || ctx->needs_input_grad(3) || ctx->needs_input_grad(4)) {
      at::Tensor dweights = block_grads.t().mm(x.view({-1, hidden}));
      dweights.narrow(0, q_width, 2 * kv_width)
          .addmm_(context_grads.t(), context.view({-1, hidden}));
      if (ctx->needs_input_grad(2)) dq_weight = dweights.narrow(0, 0, q_width);
      if (ctx->needs_input_grad(3)) dk_weight = dweights.narrow(0, q_width, kv_width);
      if (ctx->needs_input_grad(4)) dv_weight = dweights.narrow(0, q_width + kv_width, kv_width);
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
