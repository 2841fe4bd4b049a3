// Tensor front end of the fused GSPO kernels (kernels/gspo_seam_kernels.h,
// kernels/gspo_vocab.h): checks dtypes, shapes and devices with messages that name the tensor,
// turns tensors into kernel arguments and launches on the current CUDA stream. The orchestration (all-reduce hook,
// validation policy, reference fallback) lives in ops/gspo_seam.h.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "kernels/gspo_seam_kernels.h"
#include "kernels/gspo_vocab.h"

namespace dspine::ops {

// Per-token inputs of one seam call, each [N] and contiguous on one CUDA device.
struct GspoSeamArgs {
  at::Tensor logprobs;      // fp32 lp_t
  at::Tensor target;        // int64; < 0 = masked
  at::Tensor old_logprobs;  // fp32
  at::Tensor advantages;    // fp32
  at::Tensor segment;       // int32 / int64
  at::Tensor label_counts;  // int32 / int64 / fp32
  int64_t num_segments = 0;
};

// Block-2 scalars, in the terms of docs/gspo.md ("The seam").
struct GspoFinishArgs {
  double eps_low = 0.0;
  double eps_high = 0.0;
  double divisor = 1.0;
  double coefficient_scale = 0.0;  // g/D·λ
};

// The device state of one fused seam call. local() is the whole seam when no segment spans ranks
// (2 launches). Otherwise reduce() zeroes the workspace head and runs block 1 + the segmented
// reduction (launches 1 and 2), segment_sums() is where the cross-rank all-reduce goes, and
// finish() runs block 2 (launch 3).
class GspoFusedSeam {
 public:
  GspoFusedSeam(int64_t num_tokens, int64_t num_segments, const at::Device& device);

  // Returns fp32 [4] = {loss, new_logprobs, clipped_fraction, ratio_mean}; writes c_t into
  // `coefficient` ([N] fp32, contiguous) unless it is undefined.
  at::Tensor local(const GspoSeamArgs& args, const GspoFinishArgs& scalars,
                   const at::Tensor& coefficient);
  void reduce(const GspoSeamArgs& args);
  // [2, S] fp32 view of the workspace: row 0 = U_s, row 1 = V_s.
  at::Tensor segment_sums() const;
  // Returns fp32 [4] = {loss, new_logprobs, clipped_fraction, ratio_mean} (this rank's share).
  // Writes c_t into `coefficient` ([N] fp32, contiguous) unless it is undefined.
  at::Tensor finish(const GspoSeamArgs& args, const GspoFinishArgs& scalars,
                    const at::Tensor& coefficient);
  // Status bits of kernels/gspo_seam_kernels.h raised so far (seam and vocab forward); waits for
  // the stream.
  int status() const;
  // A zeroed status word for the vocab forward, kept apart from the workspace (whose status word
  // reduce clears).
  int* vocab_status_pointer();

 private:
  // gspo_seam_local or gspo_seam_finish: block 2 into a new fp32 [4] (and c_t).
  using Block2Launch = cudaError_t (*)(const kernels::GspoSeamTokens&,
                                       const kernels::GspoSeamScalars&, void*, float*, float*,
                                       cudaStream_t);
  at::Tensor block2(Block2Launch launch, const char* what, const GspoSeamArgs& args,
                    const GspoFinishArgs& scalars, const at::Tensor& coefficient);

  at::Tensor workspace_;  // fp32 words
  at::Tensor vocab_status_;  // int32 [1], created by the first vocab_status_pointer()
  int64_t num_tokens_;
  int64_t num_segments_;
};

// The kernels' view of CUDA logits [N, V] (bf16 or fp32, unit column stride); `what` names the
// caller in the error for anything else.
kernels::GspoLogits gspo_logits_view(const at::Tensor& logits, const char* what);

// Vocab forward of the monolithic path: logits [N, V] bf16/fp32 (unit column stride) → logprobs
// and lse, [N] fp32 each (allocated here). Bad targets are flagged in `seam`'s status.
void gspo_vocab_forward(const at::Tensor& logits, const at::Tensor& target, double logits_scale,
                        GspoFusedSeam& seam, at::Tensor& logprobs, at::Tensor& lse);

// Vocab backward: grad (logits' shape and dtype, unit column stride) = c·(p − δ), overwritten or
// accumulated (masked rows zeroed or left untouched).
void gspo_vocab_backward(const at::Tensor& logits, const at::Tensor& target,
                         const at::Tensor& lse, const at::Tensor& coefficient,
                         double logits_scale, at::Tensor& grad, bool accumulate);

}  // namespace dspine::ops
