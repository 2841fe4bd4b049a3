// Acceptance length of a DSpine draft (the number that decides a draft's worth): from every
// anchor of held-out samples, draft a block greedily (backbone argmax, or the refinement-head
// walk of inference) and count the leading tokens equal to the target's; τ = that count + 1,
// since the target adds one token of its own at verification.
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
