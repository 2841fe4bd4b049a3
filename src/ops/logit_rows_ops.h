// Draws from, and greedy choices of, rows of logits (docs/gspo.md, "Sampling from the logits"):
// the fused kernel (kernels/logit_rows.h) on CUDA and the ATen reference it is tested against.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>

namespace dspine::ops {

// The choice of a row with nothing to draw from (NaN or +inf in it, or no finite logit).
constexpr int64_t kNoDraw = -1;

// G draws per row of logits z [R, V] from softmax(λ·z/τ), by inverse CDF against uniforms.
struct LogitRowDraws {
  at::Tensor choices;   // [R, G] int64 column
  at::Tensor logprobs;  // [R, G] fp32, the choice under the policy softmax(λ·z)
  at::Tensor probs;     // [R, G] fp32, the choice under the sampling distribution softmax(λ·z/τ)
};

// Inverse-CDF draws from unnormalised row probabilities `probs` [R, C]: for each uniform of
// `uniforms` [R, G] in [0, 1), the first column whose cumulative sum exceeds uniform · row total
// (the last column of nonzero probability where rounding leaves the target at the total).
// Returns [R, G] int64.
at::Tensor sample_categorical(const at::Tensor& probs, const at::Tensor& uniforms);

// Draws from `logits` [R, V] with `uniforms` [R, G] in [0, 1), λ = logits_scale > 0 and
// τ = temperature > 0. fused: the row kernel (CUDA logits, bf16 or fp32, unit column stride; no
// [R, V] intermediate); otherwise the reference, fp32 softmaxes of whole rows and their
// cumulative sums. The two choose the same column except where a uniform lands within rounding of
// a column's boundary. Every choice of a row of finite logits (−inf allowed) is a column in
// [0, V) of nonzero probability; a row holding NaN or +inf, or no finite value, draws
// kNoDraw with NaN log-probability and probability.
LogitRowDraws sample_logit_rows(const at::Tensor& logits, const at::Tensor& uniforms,
                                double logits_scale, double temperature, bool fused);

// Throws, naming the first row of `choices` [R, G] that drew kNoDraw, with `what` as
// the message's subject. Reads the device: for callers that may wait for the draws.
void check_rows_drawn(const at::Tensor& choices, const std::string& what);

// The greedy column ([R] int64, the first of the row's maximum) and log Σ_j exp(z[r, j]) ([R]
// fp32) of each row of `logits` [R, V]; fused as above.
std::pair<at::Tensor, at::Tensor> logit_row_argmax_lse(const at::Tensor& logits, bool fused);

}  // namespace dspine::ops
