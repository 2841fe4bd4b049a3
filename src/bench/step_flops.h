// Analytic FLOP count of one DSpine training micro-step (forward + backward of the replay), for
// the step benchmark's MFU (docs/benchmarks.md, "Training step benchmark"). Only matrix products
// count (2 FLOP per multiply-add); norms, softmax, RoPE, gathers and the fp32 elementwise terms
// are left out, as are the forward recomputations of checkpointed objective chunks (model FLOPs,
// not executed FLOPs).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/dspine_config.h"

namespace dspine::bench {

// The shape one micro-batch trains on.
struct StepShape {
  int64_t rows = 0;          // batch rows (per rank)
  int64_t seq_len = 0;       // S: context tokens per row
  int64_t anchors = 0;       // N: anchor blocks per row
  double mean_anchor = 0.0;  // mean anchor position = mean visible context prefix of a block
  // Distinct target positions a row's proposals read (their teacher states; blocks overlap).
  double teacher_positions = 0.0;
};

// One group of products: its forward FLOPs and those of its backward.
struct FlopPart {
  std::string name;
  double forward = 0.0;
  double backward = 0.0;
};

// Every GEMM of the draft and the objective, grouped (context, projections, mlp, attention,
// injection, refinement, teacher_logits, draft_logits); see step_flops.cpp for the rules.
std::vector<FlopPart> dspine_step_flops(const model::DSpineModelConfig& model,
                                        const StepShape& shape);

// Forward + backward over all parts.
double total_flops(const std::vector<FlopPart>& parts);

// The expected number of distinct positions read by a row's proposals when `anchors` anchors are
// drawn uniformly without replacement from its valid anchor positions (valid[a] for a in
// [0, S - 1)) and the anchor at a reads the teacher states at a .. a + proposals - 1 (within
// [0, S - 1)).
double expected_teacher_positions(const std::vector<bool>& valid, int64_t anchors,
                                  int64_t proposals);

}  // namespace dspine::bench
