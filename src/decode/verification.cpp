#include "decode/verification.h"

#include <ATen/ATen.h>

namespace dspine::decode {

namespace {
// The number of leading true entries of each row of `accept` [B, T]: [B] int64.
at::Tensor leading_true(const at::Tensor& accept) { return accept.to(at::kLong).cumprod(1).sum(1); }
}  // namespace

Verdict verify_greedy(const at::Tensor& target_logits, const at::Tensor& proposals) {
  const auto choices = target_logits.argmax(-1);  // [B, T + 1]
  // 1 where a proposal differs from the target's choice; the sentinel always does, so the first 1
  // (argmax returns the first maximum) is the accepted count, T when every draft agrees.
  auto mismatch = at::empty(choices.sizes(), choices.options().dtype(at::kByte));
  at::ne_out(mismatch, proposals, choices);
  Verdict out;
  out.accepted = mismatch.argmax(1);
  // Accepted drafted tokens equal the target's choices there, so the choices are the output.
  out.tokens = choices;
  return out;
}

at::Tensor sample_rows(const at::Tensor& probs, at::Generator generator) {
  // argmax p_i / e_i with e_i ~ Exp(1) draws i with probability p_i (the exponential form of the
  // Gumbel-max trick, which at::multinomial uses for one draw too): no check that reads the device
  // back, so a CUDA graph can capture it.
  return probs.div(at::empty_like(probs).exponential_(1.0, generator)).argmax(-1);
}

Verdict verify_sampled(const at::Tensor& target_probs, const at::Tensor& draft_probs,
                       const at::Tensor& drafted, at::Generator generator) {
  const int64_t rows = drafted.size(0), slots = drafted.size(1);
  const auto index = drafted.unsqueeze(-1);
  const auto p = target_probs.narrow(1, 0, slots).gather(-1, index).squeeze(-1);  // [B, T]
  const auto q = draft_probs.gather(-1, index).squeeze(-1);
  const auto u = at::rand({rows, slots}, generator, target_probs.options());
  // u < p / q, written without the division (q > 0: d_j was drawn from q_j).
  Verdict out;
  out.accepted = leading_true(u.mul(q).lt(p));
  // The next token's distribution: the residual at the first rejected slot, p_T after a whole
  // block (the residual row is padded with p_T's so that both gather alike).
  const auto residual = (target_probs.narrow(1, 0, slots) - draft_probs).clamp_min_(0.0);
  const auto next_rows =
      at::cat({residual, target_probs.narrow(1, slots, 1)}, 1)  // [B, T + 1, V]
          .gather(1, out.accepted.view({rows, 1, 1}).expand({rows, 1, target_probs.size(2)}))
          .squeeze(1);
  // A residual that rounding left empty (p_j = q_j to the last bit) falls back to p_j itself.
  const auto plain =
      target_probs
          .gather(1, out.accepted.view({rows, 1, 1}).expand({rows, 1, target_probs.size(2)}))
          .squeeze(1);
  const auto empty = next_rows.sum(-1, /*keepdim=*/true).le(0.0);
  const auto next = sample_rows(at::where(empty, plain, next_rows), generator);
  out.tokens = at::cat({drafted, drafted.narrow(1, 0, 1)}, 1).clone();
  out.tokens.scatter_(1, out.accepted.view({rows, 1}), next.view({rows, 1}));
  return out;
}

}  // namespace dspine::decode
