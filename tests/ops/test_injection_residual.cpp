// The injection residual's ATen reference (src/ops/injection_residual_ops.h) against the
// adjacent injection's original composition, the receiver/predecessor rows' reference
// (src/ops/injection_pairs_ops.h) against hand-built rows, and the rules for when the fused kernels
// apply.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "core/error.h"
#include "ops/injection_pairs_ops.h"
#include "ops/injection_residual_ops.h"

namespace dspine {
namespace {

// The write as the injection composed it before the op existed: rms of the written slots, a
// product in h's dtype, then the anchor slot concatenated back.
torch::Tensor composed(const torch::Tensor& h, const torch::Tensor& delta, bool skip_first) {
  auto written = skip_first ? h.slice(2, 1) : h;
  auto rms = (at::linalg_vector_norm(written, 2, {-1}, true, torch::kFloat32) /
              std::sqrt(static_cast<double>(h.size(-1))))
                 .to(h.scalar_type());
  auto out = written + rms * delta;
  return skip_first ? torch::cat({h.slice(2, 0, 1), out}, 2) : out;
}

TEST(InjectionResidual, ReferenceMatchesTheComposition) {
  torch::manual_seed(3);
  for (bool skip_first : {false, true}) {
    auto h = torch::randn({2, 3, 5, 24}).to(torch::kBFloat16);
    auto delta = torch::randn({2, 3, skip_first ? 4 : 5, 24}).to(torch::kBFloat16);
    EXPECT_TRUE(torch::equal(ops::injection_residual_reference(h, delta, skip_first),
                             composed(h, delta, skip_first)));
  }
}

TEST(InjectionResidual, SkippedSlotIsUnchangedAndWrittenSlotsScaleByRms) {
  auto h = torch::zeros({1, 1, 3, 4});
  h[0][0][0] = torch::tensor({1.0, 2.0, 3.0, 4.0});
  h[0][0][1] = torch::tensor({2.0, 2.0, 2.0, 2.0});  // rms 2
  auto delta = torch::ones({1, 1, 2, 4});
  auto out = ops::injection_residual_reference(h, delta, true);
  EXPECT_TRUE(torch::equal(out[0][0][0], h[0][0][0]));
  EXPECT_TRUE(torch::allclose(out[0][0][1], torch::full({4}, 4.0)));
  EXPECT_TRUE(torch::equal(out[0][0][2], torch::zeros({4})));  // rms 0: nothing written
}

TEST(InjectionResidual, FusableOnlyOnCudaWithPairedShapes) {
  auto h = torch::randn({2, 4, 64});
  EXPECT_FALSE(ops::injection_residual_fusable(h, torch::randn({2, 3, 64}), true));  // CPU
  if (!torch::cuda::is_available()) return;
  auto hc = h.to(torch::kCUDA);
  EXPECT_TRUE(ops::injection_residual_fusable(hc, torch::randn({2, 3, 64}, hc.options()), true));
  EXPECT_TRUE(ops::injection_residual_fusable(hc, torch::randn({2, 4, 64}, hc.options()), false));
  EXPECT_FALSE(ops::injection_residual_fusable(hc, torch::randn({2, 4, 64}, hc.options()), true));
  EXPECT_FALSE(ops::injection_residual_fusable(
      hc, torch::randn({2, 3, 64}, hc.options().dtype(torch::kFloat64)), true));
  EXPECT_FALSE(ops::injection_residual_fusable(torch::randn({2, 4, 6}, hc.options()),
                                               torch::randn({2, 3, 6}, hc.options()), true));
}

TEST(InjectionResidual, FusedRefusesInputsItCannotTakeByName) {
  auto h = torch::randn({2, 4, 8});
  try {
    ops::injection_residual_fused(h, torch::randn({2, 4, 8}), true);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("[2, 4, 8]"), std::string::npos) << text;
    EXPECT_NE(text.find("skip_first true"), std::string::npos) << text;
  }
}

// For a linear readout R, r = h·Rᵀ and delta_r = delta·Rᵀ give the readout of the written
// state; the write itself is injection_residual_reference's, bit for bit.
TEST(InjectionResidual, ReadoutReferenceIsTheReadoutOfTheWrite) {
  torch::manual_seed(4);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  for (bool skip_first : {false, true}) {
    auto h = torch::randn({2, 3, 5, 24}, f64);
    auto delta = torch::randn({2, 3, skip_first ? 4 : 5, 24}, f64);
    auto readout = torch::randn({7, 24}, f64);
    auto [out, out_r] = ops::injection_residual_readout_reference(
        h, delta, torch::matmul(h, readout.t()), torch::matmul(delta, readout.t()), skip_first);
    EXPECT_TRUE(torch::equal(out, ops::injection_residual_reference(h, delta, skip_first)));
    EXPECT_TRUE(torch::allclose(out_r, torch::matmul(out, readout.t()), 1e-12, 1e-12));
  }
}

TEST(InjectionResidual, ReadoutFusedRefusesInputsItCannotTakeByName) {
  auto h = torch::randn({2, 4, 8});
  EXPECT_FALSE(ops::injection_residual_readout_fusable(
      h, torch::randn({2, 3, 8}), torch::randn({2, 4, 2}), torch::randn({2, 3, 2}), true));  // CPU
  try {
    ops::injection_residual_readout_fused(h, torch::randn({2, 3, 8}), torch::randn({2, 4, 2}),
                                          torch::randn({2, 4, 2}), true);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("delta_r [2, 4, 2]"), std::string::npos) << text;
    EXPECT_NE(text.find("skip_first true"), std::string::npos) << text;
  }
}

TEST(InjectionPairs, ReferenceReceivesAtTheNextSlotAndReadsThePrevious) {
  // features[b][j] = 10·b + j in every column, the anchor's code -1 - b.
  const auto features = (torch::arange(3).view({3, 1, 1}) * 10 + torch::arange(4).view({1, 4, 1}))
                            .expand({3, 4, 2})
                            .to(torch::kFloat32);
  const auto anchor = -1 - torch::arange(3).view({3, 1, 1}).expand({3, 1, 2}).to(torch::kFloat32);
  auto [receiver, predecessor] = ops::injection_pairs_reference(features, anchor);
  ASSERT_EQ(receiver.sizes(), (std::vector<int64_t>{3, 3, 2}));
  ASSERT_EQ(predecessor.sizes(), (std::vector<int64_t>{3, 3, 2}));
  for (int64_t b = 0; b < 3; ++b) {
    for (int64_t k = 0; k < 3; ++k) {
      EXPECT_EQ(receiver[b][k][1].item<float>(), 10 * b + k + 1);
      EXPECT_EQ(predecessor[b][k][0].item<float>(), k == 0 ? -1 - b : 10 * b + k);
    }
  }
}

TEST(InjectionPairs, FusedRefusesWhatItCannotTakeByName) {
  const auto features = torch::randn({2, 4, 8}), anchor = torch::randn({2, 1, 8});
  EXPECT_FALSE(ops::injection_pairs_fusable(features, anchor));  // CPU
  try {
    ops::injection_pairs_fused(features, anchor);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("features Float [2, 4, 8] on cpu"), std::string::npos) << text;
    EXPECT_NE(text.find("anchor Float [2, 1, 8] on cpu"), std::string::npos) << text;
  }
  if (!torch::cuda::is_available()) return;
  const auto f = features.to(torch::kCUDA), a = anchor.to(torch::kCUDA);
  EXPECT_TRUE(ops::injection_pairs_fusable(f, a));
  EXPECT_FALSE(ops::injection_pairs_fusable(f, a.expand({2, 2, 8})));  // anchor not [.., 1, r]
  EXPECT_FALSE(ops::injection_pairs_fusable(f.narrow(2, 0, 6), a.narrow(2, 0, 6)));  // 24 bytes
  EXPECT_FALSE(ops::injection_pairs_fusable(f.narrow(1, 0, 1), a));                  // T = 1
}

}  // namespace
}  // namespace dspine
