// The reference path of ops/logit_rows_ops.h on the CPU (the fused kernel's parity test against it
// is tests/gpu/test_logit_rows_gpu.cpp), and the fused kernel's refusal of CPU logits.
#include <gtest/gtest.h>

#include <torch/torch.h>

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
}

}  // namespace
}  // namespace dspine::ops
