// MasterAdamW's fused path (ATen's CUDA multi-tensor AdamW kernel, clip folded in) against the
// reference torch::optim::AdamW step on CUDA fp32 masters: equal within fp32 rounding step by
// step, a first step checked by hand, and checkpoints that resume across the two paths.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/adamw_rig.h"
#include "common/require_cuda.h"

namespace dspine::testing {
namespace {

const torch::Device kCuda(torch::kCUDA, 0);

TEST(MasterAdamWGpu, FusedMatchesReferenceWithClippingWeightDecayAndChangingLr) {
  REQUIRE_CUDA();
  auto rigs = expect_fused_as_reference(kCuda);
  EXPECT_TRUE(rigs.first->sharded->units()[1].master().is_cuda());
}

TEST(MasterAdamWGpu, FirstStepMatchesTheFormulaOnBothPaths) {
  REQUIRE_CUDA();
  expect_first_step_by_hand(/*fused=*/true, kCuda);
  expect_first_step_by_hand(/*fused=*/false, kCuda);
}

TEST(MasterAdamWGpu, CheckpointsResumeAcrossPaths) {
  REQUIRE_CUDA();
  expect_checkpoints_interchange(kCuda);
}

}  // namespace
}  // namespace dspine::testing
