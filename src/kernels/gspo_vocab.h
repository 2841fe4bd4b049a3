// Vocab-level halves of the monolithic GSPO path (docs/gspo.md, "The seam"), on raw device
// pointers: the forward reads each labelled row of logits once (max, log-sum-exp, log-prob of the
// sampled token, with the logits scale λ); the backward reads it again and writes c_t·(p − δ)
// straight into the logits gradient. One block per row, statistics in fp32: no [N, V] fp32
// intermediate exists. The seam (gspo_seam_kernels.h) runs between the two on the forward's
// log-probs.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace dspine::kernels {

enum class GspoLogitsType { kFloat32, kBFloat16 };

// Row-major [rows, vocab] matrix with unit column stride.
struct GspoLogits {
  const void* data = nullptr;
  GspoLogitsType type = GspoLogitsType::kBFloat16;
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t row_stride = 0;  // elements
};

// logprobs[t] = λ·z[t, y_t] − lse[t], lse[t] = log Σ_j exp(λ·z[t, j]) (both fp32). Masked rows
// (target < 0) are not read and get 0 in both. An unmasked target outside [0, vocab) ORs
// kGspoBadTarget into *status (a word the caller zeroed) and is treated as masked.
cudaError_t gspo_vocab_forward(const GspoLogits& logits, const int64_t* target,
                               float logits_scale, float* logprobs, float* lse, int* status,
                               cudaStream_t stream);

// grad[t, j] = c_t·(exp(λ·z[t, j] − lse[t]) − [j = y_t]) in the logits' element type, rounded
// once. accumulate: added to the existing gradient, masked rows left untouched; otherwise
// overwritten, masked rows set to 0. grad has the logits' shape and type, its own row stride.
cudaError_t gspo_vocab_backward(const GspoLogits& logits, const int64_t* target, const float* lse,
                                const float* coefficient, float logits_scale, void* grad,
                                int64_t grad_row_stride, bool accumulate, cudaStream_t stream);

}  // namespace dspine::kernels
