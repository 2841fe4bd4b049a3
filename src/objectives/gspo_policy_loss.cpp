#include "objectives/gspo_policy_loss.h"

#include <torch/torch.h>

#include <algorithm>

#include "core/error.h"
#include "ops/vocab_policy.h"

namespace dspine::objectives {
namespace {

void check_samples(const at::Tensor& logits, const GspoPolicySamples& s) {
  if (!logits.defined() || logits.dim() != 2)
    fail("gspo policy loss: logits must be [R, V], got {}",
         logits.defined() ? c10::str(logits.sizes()) : "none");
  const int64_t rows = logits.size(0);
  for (const auto* t : {&s.targets, &s.old_logprobs, &s.advantages, &s.segments, &s.label_counts}) {
    if (!t->defined() || t->dim() != 2 || t->size(0) != rows || t->size(1) != s.targets.size(1))
      fail("gspo policy loss: every per-sample input must be [R = {}, G], got {}", rows,
           t->defined() ? c10::str(t->sizes()) : "none");
  }
  if (!s.seam_order.defined() || s.seam_order.numel() != s.targets.numel())
    fail("gspo policy loss: seam_order must hold R·G = {} indices", s.targets.numel());
  if (s.targets.ge(logits.size(1)).any().item<bool>())
    fail("gspo policy loss: a target id is outside the {} logits columns", logits.size(1));
}

struct Computed {
  GspoSeamResult seam;
  at::Tensor logprobs;
  at::Tensor grad;
};

Computed compute(const at::Tensor& logits, const GspoPolicySamples& s, GspoSeamParams params,
                 dist::Communicator& comm, GspoBackend backend) {
  check_samples(logits, s);
  const bool fused = ops::gspo_fused_backend(backend, logits);
  const double scale = params.logits_scale;
  const auto mask = s.targets.ge(0);
  const auto columns = s.targets.clamp_min(0);
  const auto lse =
      ops::policy_row_logsumexp(logits, s.targets.select(1, 0).contiguous(), scale, fused);
  auto logprobs = logits.gather(1, columns).to(at::kFloat) * scale - lse.unsqueeze(1);
  logprobs = at::where(mask, logprobs, at::zeros({}, logprobs.options()));

  auto in_order = [&](const at::Tensor& t) { return t.reshape(-1).index_select(0, s.seam_order); };
  ops::GspoTokens tokens{in_order(s.targets), in_order(s.old_logprobs), in_order(s.advantages),
                    in_order(s.segments), in_order(s.label_counts)};
  params.num_segments = s.num_segments;
  params.grad_output = 1.0;
  Computed out;
  out.seam = ops::gspo_segment_seam(in_order(logprobs), tokens, params, comm, backend);
  auto coefficient = at::zeros({s.targets.numel()}, logprobs.options())
                         .index_copy_(0, s.seam_order, out.seam.coefficient)
                         .view(s.targets.sizes());
  out.grad = at::empty_like(logits);
  ops::write_policy_gradient(logits, s.targets, lse, coefficient, logprobs, scale, fused, out.grad);
  out.logprobs = logprobs;
  return out;
}

// Autograd node: forward runs the seam with g = 1 and keeps the logits gradient; backward scales
// it by the incoming scalar gradient (c_t is linear in g).
class PolicyLossFunction : public torch::autograd::Function<PolicyLossFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                            const GspoPolicySamples* samples, const GspoSeamParams* params,
                            dist::Communicator* comm, GspoBackend backend, Computed* out) {
    *out = compute(logits, *samples, *params, *comm, backend);
    ctx->saved_data["grad"] = out->grad;
    return out->seam.loss.clone();
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grad_outputs) {
    auto grad = ctx->saved_data["grad"].toTensor();
    ctx->saved_data.erase("grad");  // the only reference left: the caller may take it over
    const auto& upstream = grad_outputs[0];
    // In place: the node is used once (the saved gradient is the biggest tensor of the update).
    if (upstream.defined()) grad.mul_(upstream.to(grad.scalar_type()));
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

GspoPolicyLoss gspo_policy_loss(const at::Tensor& logits, const GspoPolicySamples& samples,
                                GspoSeamParams params, dist::Communicator& comm,
                                GspoBackend backend) {
  Computed computed;
  auto loss = PolicyLossFunction::apply(logits, &samples, &params, &comm, backend, &computed);
  computed.grad = at::Tensor();  // the node holds it until backward
  return {loss, computed.seam, computed.logprobs};
}

}  // namespace dspine::objectives
