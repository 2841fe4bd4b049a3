// Acceptance length of a DSpine draft (the number that decides a draft's worth), from every anchor
// of held-out samples; τ counts the target's own token added at verification (accepted + 1).
// - Greedy: draft a block by backbone argmax, or by the refinement-head walk of inference, and
//   count the leading tokens equal to the target's tokens.
// - Speculative sampling: drafting from the backbone distribution q at temperature 1 against the
//   target's distribution p (softmax of the target's head on its last hidden state), slot i is
//   accepted with probability α_i = Σ_y min(p_i(y), q_i(y)); the expected accepted count is
//   Σ_j Π_{i≤j} α_i (slots conditioned on the data's prefix, as in training).
#pragma once

#include <ATen/core/Generator.h>

#include <cstdint>
#include <vector>

#include "data/batch.h"
#include "dist/communicator.h"
#include "objectives/dspine_forward.h"

namespace dspine::objectives {

struct AcceptanceStats {
  int64_t blocks = 0;               // anchor blocks measured (all ranks)
  double backbone_length = 0;       // mean τ, backbone argmax
  double refinement_length = 0;     // mean τ, refinement-head walk
  double sampled_length = 0;        // mean expected τ, speculative sampling from the backbone
  std::vector<int64_t> backbone_histogram;    // blocks per accepted count 0..T
  std::vector<int64_t> refinement_histogram;
};

// Every valid anchor of `batches` (the model's num_anchors must cover them to measure all),
// reduced over `comm`. `top_k`: refinement candidates; `chunk_blocks`: blocks per vocabulary
// chunk.
AcceptanceStats measure_acceptance(DSpineTrainingModel& model,
                                   const std::vector<data::DraftBatch>& batches, int64_t top_k,
                                   int64_t chunk_blocks, at::Generator& generator,
                                   dist::Communicator& comm);

}  // namespace dspine::objectives
