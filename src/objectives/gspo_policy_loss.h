// The GSPO update's loss on policy logits, through the segment seam (docs/gspo.md). A logits row
// may serve several sampled tokens: the G blocks drawn from one anchor share the backbone's
// logits slot by slot, so the vocabulary projection is done once per slot instead of G times.
// The loss is an autograd node whose gradient the seam computes in its forward (the monolithic
// vocab path): fused kernels on CUDA, the chunked ATen reference on the CPU, no fp32 [rows, V]
// tensor on the GPU.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "dist/communicator.h"
#include "ops/gspo_seam.h"

namespace dspine::objectives {

using ops::GspoBackend;
using ops::GspoSeamParams;
using ops::GspoSeamResult;

// Sampled tokens of R logits rows, G per row; a row's samples are all masked or none.
struct GspoPolicySamples {
  at::Tensor targets;       // [R, G] int64 column of the logits; < 0 = masked
  at::Tensor old_logprobs;  // [R, G] fp32
  at::Tensor advantages;    // [R, G] fp32
  at::Tensor segments;      // [R, G] int64 segment ids in [0, num_segments)
  at::Tensor label_counts;  // [R, G] int64 labelled tokens of the whole segment
  // The R·G tokens in seam order: entry j is the row-major index r·G + g of the j-th token, so
  // that every segment's tokens form one contiguous run (the fused seam's packing).
  at::Tensor seam_order;    // [R·G] int64
  int64_t num_segments = 0;
};

struct GspoPolicyLoss {
  at::Tensor loss;        // 0-dim fp32 with grad: this rank's share Σ m·ℓ / D
  GspoSeamResult seam;    // detached metrics (this rank's shares) and segment sums
  at::Tensor logprobs;    // [R, G] fp32 new log-probs of the targets (0 where masked)
};

// params.grad_output is ignored: the loss carries its gradient. Collectives as the seam's.
GspoPolicyLoss gspo_policy_loss(const at::Tensor& logits, const GspoPolicySamples& samples,
                                GspoSeamParams params, dist::Communicator& comm,
                                GspoBackend backend = GspoBackend::kAuto);

}  // namespace dspine::objectives
