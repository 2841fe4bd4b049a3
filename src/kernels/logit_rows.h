// Statistics of, and draws from, rows of logits on raw device pointers (docs/gspo.md, "Sampling
// from the logits"): the rollout samples G tokens per draft slot and the teacher verifier needs
// each row's greedy token and log-sum-exp, all without an fp32 [rows, V] copy. One block per row:
// a pass over the row for its maximum, argmax and two exponential sums (the policy's scale λ and
// the sampling scale β = λ/τ), then, only when draws are asked, an inverse-CDF pass that stops
// at the tile where the last draw lands.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/gspo_vocab.h"

namespace dspine::kernels {

// Per row r of z = logits (all outputs optional: nullptr skips them):
//   argmax[r]  = the first column of the row's maximum (int64);
//   lse[r]     = log Σ_j exp(λ·z[r, j]) (fp32).
// With draws_per_row G > 0 and uniforms [R, G] in [0, 1):
//   choices[r, g]  = the first column j of nonzero probability whose inclusive prefix
//                    Σ_{i≤j} exp(β·(z_i − max)) exceeds uniforms[r, g]·Σ_i exp(β·(z_i − max)) (the
//                    last column of nonzero probability where rounding leaves the target past the
//                    row's total). Always in [0, V) with probs[r, g] > 0 for a row of finite
//                    logits (−inf allowed, one finite value needed); a row holding NaN or +inf, or
//                    only −inf, draws kLogitRowsNoDraw with NaN logprobs and probs;
//   logprobs[r, g] = λ·z[r, c] − lse[r], the choice under softmax(λ·z);
//   probs[r, g]    = the choice's probability under softmax(β·z).
// λ and β must be > 0 with λ·log2(e) and β·log2(e) finite in fp32. G is at most
// kLogitRowsMaxDraws.
struct LogitRowOutputs {
  int64_t* argmax = nullptr;
  float* lse = nullptr;
  int64_t* choices = nullptr;
  float* logprobs = nullptr;
  float* probs = nullptr;
};

constexpr int64_t kLogitRowsMaxDraws = 1024;
constexpr int64_t kLogitRowsNoDraw = -1;  // the choice of a row with nothing to draw from

cudaError_t logit_rows(const GspoLogits& logits, float logits_scale, float sampling_scale,
                       const float* uniforms, int64_t draws_per_row, const LogitRowOutputs& out,
                       cudaStream_t stream);

}  // namespace dspine::kernels
