// MasterAdamW's fused path (ATen's multi-tensor AdamW kernel, clip folded in) against the
// reference torch::optim::AdamW step on CPU fp32 masters: equal within fp32 rounding step by
// step, a first step checked by hand, and checkpoints that resume across the two paths.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/adamw_rig.h"

namespace dspine::testing {
namespace {

const torch::Device kCpu(torch::kCPU);

TEST(MasterAdamW, FusedMatchesReferenceWithClippingWeightDecayAndChangingLr) {
  auto [fused, reference] = expect_fused_as_reference(kCpu);
  // The paths round differently, so equal masters would mean the fused kernel never ran.
  EXPECT_FALSE(torch::equal(fused->sharded->units()[1].master(),
                            reference->sharded->units()[1].master()));
}

TEST(MasterAdamW, FirstStepMatchesTheFormulaOnBothPaths) {
  expect_first_step_by_hand(/*fused=*/true, kCpu);
  expect_first_step_by_hand(/*fused=*/false, kCpu);
}

TEST(MasterAdamW, CheckpointsResumeAcrossPaths) { expect_checkpoints_interchange(kCpu); }

TEST(MasterAdamW, Bf16ModelStepsFromItsOwnGradient) { expect_bf16_model_steps(kCpu); }

}  // namespace
}  // namespace dspine::testing
