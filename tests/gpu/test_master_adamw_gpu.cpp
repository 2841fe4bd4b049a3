// MasterAdamW's fused path (the project's master AdamW kernel, clip folded in) against the
// reference torch::optim::AdamW step on CUDA fp32 masters: equal within fp32 rounding step by
// step, a first step checked by hand, checkpoints that resume across the two paths, a bf16 model
// stepped from its own gradient; and the kernel bitwise against ATen's fused CUDA AdamW.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/ops/_fused_adamw.h>

#include <optional>
#include <string>

#include "common/adamw_rig.h"
#include "common/require_cuda.h"
#include "ops/master_adamw_ops.h"

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

TEST(MasterAdamWGpu, Bf16ModelStepsFromItsOwnGradient) {
  REQUIRE_CUDA();
  expect_bf16_model_steps(kCuda);
}

// The master AdamW kernel against ATen's fused CUDA AdamW (the arithmetic it reproduces) on the
// same tensors: the same bits for the master and both moments, with and without clipping and
// weight decay, from an fp32 gradient and from a bf16 one (ATen given its exact fp32 widening);
// an odd length (the element-wise tail) and a misaligned slice (the element-wise path).
TEST(MasterAdamWGpu, KernelIsBitwiseAtensFusedAdamW) {
  REQUIRE_CUDA();
  torch::manual_seed(11);
  const auto f32 = torch::TensorOptions().device(kCuda).dtype(torch::kFloat);
  for (const int64_t offset : {0, 1}) {
    for (const auto grad_type : {torch::kFloat, torch::kBFloat16}) {
      for (const double clip : {1.0, 0.37}) {
        for (const double weight_decay : {0.0, 0.1}) {
          const int64_t n = 1'000'003;
          auto master = torch::randn({n + offset}, f32).narrow(0, offset, n);
          auto exp_avg = (torch::randn({n + offset}, f32) * 1e-3).narrow(0, offset, n);
          auto exp_avg_sq = (torch::rand({n + offset}, f32) * 1e-6).narrow(0, offset, n);
          const auto grad =
              (torch::randn({n + offset}, f32) * 1e-2).to(grad_type).narrow(0, offset, n);
          auto weights =
              torch::empty({n + offset}, f32.dtype(torch::kBFloat16)).narrow(0, offset, n);
          const auto before = master.clone();
          auto aten_master = master.clone(), aten_avg = exp_avg.clone(),
               aten_sq = exp_avg_sq.clone();
          const ops::AdamWStep step{2e-3, 0.9, 0.95, weight_decay, 1e-8, 3, clip};
          ops::master_adamw_step(master, grad, exp_avg, exp_avg_sq, weights, step);
          std::optional<torch::Tensor> grad_scale;
          if (clip < 1.0) grad_scale = torch::full({1}, 1.0 / clip, f32);
          at::_fused_adamw_({aten_master}, {grad.to(torch::kFloat)}, {aten_avg}, {aten_sq}, {},
                            {torch::full({}, 3.0, f32)}, step.lr, step.beta1, step.beta2,
                            weight_decay, step.eps, false, false, grad_scale);
          const std::string what = "offset " + std::to_string(offset) + " grad " +
                                   c10::toString(grad_type) + " clip " + std::to_string(clip) +
                                   " wd " + std::to_string(weight_decay);
          EXPECT_TRUE(torch::equal(master, aten_master)) << what;
          EXPECT_TRUE(torch::equal(exp_avg, aten_avg)) << what;
          EXPECT_TRUE(torch::equal(exp_avg_sq, aten_sq)) << what;
          EXPECT_TRUE(torch::equal(weights, master.to(torch::kBFloat16))) << what;
          EXPECT_FALSE(torch::equal(master, before)) << what;  // the step ran
        }
      }
    }
  }
}

}  // namespace
}  // namespace dspine::testing
