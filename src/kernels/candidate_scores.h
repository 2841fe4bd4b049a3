// The refinement head's candidate scores, s[n, j] = <table[ids[n, j]], x[n]>, and the gradient
// they send to x, on raw device pointers (docs/kernels.md, "Candidate scores"). One block per row
// reads each candidate's row of the table (the LM head) straight from memory, where the ATen
// form gathers them into a [rows, k, H] tensor (2 GiB at the recipe's size, kept for the
// backward) and runs a batched matrix-vector product over it.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace dspine::kernels {

// table [vocab, hidden] bf16, ids [rows, k] int64, x and grad_x [rows, hidden] bf16, scores and
// grad_scores [rows, k] fp32; all contiguous, 16-byte aligned.
struct CandidateRows {
  int64_t rows = 0, k = 0, hidden = 0, vocab = 0;
};

// Whether the kernels take k candidates per row of `hidden` elements (k ≤ 32, hidden a multiple
// of 8).
bool candidate_scores_supported(int64_t k, int64_t hidden);

// scores in fp32 (the dot products summed in fp32 in a fixed order); an id outside [0, vocab)
// scores NaN, so that a bad candidate shows in the loss rather than reading out of bounds.
cudaError_t candidate_scores_forward(const void* table, const int64_t* ids, const void* x,
                                     float* scores, const CandidateRows& shape,
                                     cudaStream_t stream);

// grad_x[n] = Σ_j grad_scores[n, j] · table[ids[n, j]] (j in order; ids out of range add nothing).
cudaError_t candidate_scores_backward(const float* grad_scores, const void* table,
                                      const int64_t* ids, void* grad_x, const CandidateRows& shape,
                                      cudaStream_t stream);

}  // namespace dspine::kernels
