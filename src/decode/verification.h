// How the target judges a drafted block (docs/decoding.md). Both rules keep the longest accepted
// prefix of the T drafted tokens and add one token of the target's own, so a verification yields
// between 1 and T + 1 tokens, and the output has the distribution of decoding the target alone:
// - greedy (temperature 0): drafted token j is accepted while it equals the target's argmax after
//   the prefix; the target's argmax at the first mismatch (or after the whole block) follows;
// - speculative sampling (temperature > 0): drafted token j, drawn from the draft's q_j, is
//   accepted with probability min(1, p_j(d_j) / q_j(d_j)); the first rejected slot is drawn again
//   from the normalised residual max(0, p_j - q_j); after a whole accepted block the next token is
//   drawn from p_T.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

namespace dspine::decode {

struct Verdict {
  at::Tensor accepted;  // [B] int64: drafted tokens accepted, 0..T
  at::Tensor tokens;    // [B, T + 1] int64: the accepted drafted tokens, then the target's own
                        // at index `accepted`; the entries after it are meaningless
};

// target_logits [B, T + 1, V] (row b's logits after its anchor and after each drafted token);
// proposals [B, T + 1] int64: the drafted tokens, then a sentinel that no choice equals (-1), so
// that the first mismatch is one comparison and one argmax away.
Verdict verify_greedy(const at::Tensor& target_logits, const at::Tensor& proposals);

// target_probs [B, T + 1, V] and draft_probs [B, T, V] (rows summing to 1, fp32), drafted [B, T]
// drawn from draft_probs; `generator` (of the tensors' device) draws the uniforms and the
// replacement tokens.
Verdict verify_sampled(const at::Tensor& target_probs, const at::Tensor& draft_probs,
                       const at::Tensor& drafted, at::Generator generator);

// One token per row [B] from probability rows [B, V].
at::Tensor sample_rows(const at::Tensor& probs, at::Generator generator);

}  // namespace dspine::decode
