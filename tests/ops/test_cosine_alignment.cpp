// The alignment cosine's front end on any machine (the kernels are tested on CUDA in
// tests/gpu/test_cosine_alignment_gpu.cpp): the reference is ATen's cosine of the widened features
// with each position's code, and the fused form refuses what the kernels do not take by name.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "core/error.h"
#include "ops/cosine_alignment_ops.h"

namespace dspine {
namespace {

TEST(CosineAlignment, ReferenceIsTheCosineWithEachPositionsCode) {
  torch::manual_seed(2);
  const auto features = torch::randn({3, 2, 4, 8}).to(torch::kBFloat16);
  const auto codes = torch::randn({3, 4, 8});
  const auto cosine = ops::cosine_alignment_reference(features, codes, 1e-8);
  ASSERT_EQ(cosine.sizes(), torch::IntArrayRef({3, 2, 4}));
  EXPECT_EQ(cosine.scalar_type(), torch::kFloat);
  const auto f = features.to(torch::kDouble), u = codes.to(torch::kDouble);
  const auto row = f[1][1][2], code = u[1][2];
  const double expected = (row.dot(code) / (row.norm() * code.norm())).item<double>();
  EXPECT_NEAR(cosine[1][1][2].item<double>(), expected, 1e-6);
}

TEST(CosineAlignment, FusedRefusesInputsItCannotTakeByName) {
  const auto features = torch::randn({3, 2, 4, 8}), codes = torch::randn({3, 4, 8});
  EXPECT_FALSE(ops::cosine_alignment_fusable(features, codes));  // not CUDA
  try {
    ops::cosine_alignment_fused(features, codes, 1e-8);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("features Float [3, 2, 4, 8] on cpu"), std::string::npos) << text;
    EXPECT_NE(text.find("codes Float [3, 4, 8] on cpu"), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace dspine
