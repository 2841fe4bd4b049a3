// The reference path of ops/logit_rows_ops.h on the CPU (the fused kernel's parity test against it
// is tests/gpu/test_logit_rows_gpu.cpp), and the fused kernel's refusal of CPU logits.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ops/logit_rows_ops.h"

namespace dspine::ops {
namespace {

TEST(LogitRows, ReferenceDrawsFromTheTemperedSoftmaxAndScoresUnderThePolicy) {
  // Row 0 puts its mass on column 2 once tempered; row 1 is uniform over its 4 columns.
  auto logits = torch::tensor({{0.0, 1.0, 3.0, -2.0}, {0.5, 0.5, 0.5, 0.5}});
  auto uniforms = torch::tensor({{0.01, 0.99}, {0.2, 0.8}}, torch::kFloat64);
  const auto draws = sample_logit_rows(logits, uniforms, 2.0, 0.5, /*fused=*/false);
  auto sampling = torch::softmax(logits * 4.0, -1);  // λ/τ = 4
  EXPECT_TRUE(torch::equal(draws.choices, sample_categorical(sampling, uniforms)));
  EXPECT_TRUE(torch::equal(draws.choices, torch::tensor({{2, 2}, {0, 3}}, torch::kInt64)))
      << draws.choices;
  EXPECT_TRUE(torch::allclose(draws.logprobs,
                              torch::log_softmax(logits * 2.0, -1).gather(1, draws.choices)));
  EXPECT_TRUE(torch::allclose(draws.probs, sampling.gather(1, draws.choices)));
}

// A target that rounding leaves at the row's total takes the last column of nonzero probability,
// never a column past it: mass in column 0 only, and in column 1 of 3.
TEST(LogitRows, ReferenceNeverDrawsAColumnOfZeroProbability) {
  auto probs = torch::tensor({{1.0f, 0.0f, 0.0f}, {0.0f, 0.25f, 0.0f}});
  const float below_one = std::nextafter(1.0f, 0.0f);
  auto uniforms = torch::tensor({{0.0, double(below_one), 1.0}, {0.0, 0.5, 1.0}}, torch::kFloat64);
  EXPECT_TRUE(torch::equal(sample_categorical(probs, uniforms),
                           torch::tensor({{0, 0, 0}, {1, 1, 1}}, torch::kInt64)))
      << sample_categorical(probs, uniforms);
}

// Rows holding NaN or +inf, or only −inf, have nothing to draw from: kNoDraw with NaN scores, and
// check_rows_drawn names the first such row. A row of −inf but one entry draws that entry.
TEST(LogitRows, RowsWithoutFiniteLogitsDrawNothingAndAreNamed) {
  const float inf = std::numeric_limits<float>::infinity();
  auto logits = torch::tensor({{0.0f, -inf, -inf, -inf},
                               {0.0f, std::nanf(""), 1.0f, 2.0f},
                               {-inf, -inf, -inf, -inf},
                               {0.0f, inf, 1.0f, 2.0f},
                               {-inf, -inf, -inf, 3.0f}});
  auto uniforms = torch::full({5, 2}, 0.5, torch::kFloat64);
  const auto draws = sample_logit_rows(logits, uniforms, 1.0, 1.0, /*fused=*/false);
  auto expected = torch::tensor(std::vector<int64_t>{0, kNoDraw, kNoDraw, kNoDraw, 3});
  EXPECT_TRUE(torch::equal(draws.choices, expected.unsqueeze(1).expand({5, 2}))) << draws.choices;
  for (int64_t r : {1, 2, 3}) {
    EXPECT_TRUE(torch::isnan(draws.logprobs[r]).all().item<bool>()) << r;
    EXPECT_TRUE(torch::isnan(draws.probs[r]).all().item<bool>()) << r;
  }
  EXPECT_EQ(draws.probs[4][0].item<float>(), 1.0f);
  try {
    check_rows_drawn(draws.choices, "rollout");
    FAIL() << "a row of NaN was not named";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("rollout: row 1 of the logits holds NaN or +inf"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(check_rows_drawn(draws.choices.narrow(0, 4, 1), "rollout"));
}

TEST(LogitRows, ReferenceArgmaxIsTheFirstMaximum) {
  auto logits = torch::tensor({{1.0, 3.0, 3.0}, {2.0, 2.0, 2.0}});
  const auto [argmax, lse] = logit_row_argmax_lse(logits, /*fused=*/false);
  EXPECT_TRUE(torch::equal(argmax, torch::tensor({1, 0}, torch::kInt64)));
  EXPECT_TRUE(torch::allclose(lse, torch::logsumexp(logits, -1)));
}

TEST(LogitRows, BadInputsAreRefusedWithTheirShapes) {
  auto logits = torch::randn({2, 5});
  try {
    sample_logit_rows(logits, torch::rand({2, 3}), 1.0, 1.0, /*fused=*/true);
    FAIL() << "the fused kernel took CPU logits";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("needs CUDA logits"), std::string::npos) << e.what();
  }
  try {
    sample_logit_rows(logits, torch::rand({3, 3}), 1.0, 1.0, /*fused=*/false);
    FAIL() << "uniforms of another row count were taken";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("[3, 3]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(sample_logit_rows(logits, torch::rand({2, 3}), 1.0, 0.0, false), std::exception);
  // λ/τ past fp32's range would turn the kernel's weights into NaN: refused on both paths.
  EXPECT_THROW(sample_logit_rows(logits, torch::rand({2, 3}), 1.0, 1e-39, false), std::exception);
  EXPECT_THROW(sample_logit_rows(logits, torch::rand({2, 3}), 1e39, 1.0, false), std::exception);
}

}  // namespace
}  // namespace dspine::ops
