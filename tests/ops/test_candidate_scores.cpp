// The candidate scores' front end on any machine (the kernels are tested on CUDA in
// tests/gpu/test_candidate_scores_gpu.cpp): the reference is each candidate's LM-head row dotted
// with its position's refined state, in fp32, and the fused form refuses what the kernels do not
// take by name.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "core/error.h"
#include "ops/candidate_scores_ops.h"

namespace dspine {
namespace {

TEST(CandidateScores, ReferenceIsEachCandidatesRowDottedWithItsState) {
  torch::manual_seed(3);
  const auto table = torch::randn({20, 8}).to(torch::kBFloat16);
  const auto x = torch::randn({3, 4, 8}).to(torch::kBFloat16);
  const auto ids = torch::randint(20, {3, 4, 5}, torch::kLong);
  const auto scores = ops::candidate_scores_reference(table, ids, x);
  ASSERT_EQ(scores.sizes(), torch::IntArrayRef({3, 4, 5}));
  EXPECT_EQ(scores.scalar_type(), torch::kFloat);
  const auto t = table.to(torch::kDouble), v = x.to(torch::kDouble);
  for (int64_t j = 0; j < 5; ++j) {
    const double expected = t[ids[2][1][j].item<int64_t>()].dot(v[2][1]).item<double>();
    // The reference rounds its scores to bf16.
    EXPECT_NEAR(scores[2][1][j].item<double>(), expected, 1e-2 * (1.0 + std::abs(expected)));
  }
}

TEST(CandidateScores, FusedRefusesInputsItCannotTakeByName) {
  const auto table = torch::randn({20, 8}).to(torch::kBFloat16);
  const auto x = torch::randn({3, 4, 8}).to(torch::kBFloat16);
  const auto ids = torch::randint(20, {3, 4, 5}, torch::kLong);
  EXPECT_FALSE(ops::candidate_scores_fusable(table, ids, x));  // not CUDA
  try {
    ops::candidate_scores_fused(table, ids, x);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("table BFloat16 [20, 8] on cpu (requires grad: false)"), std::string::npos)
        << text;
    EXPECT_NE(text.find("candidates Long [3, 4, 5] and x BFloat16 [3, 4, 8] on cpu"),
              std::string::npos)
        << text;
  }
}

}  // namespace
}  // namespace dspine
