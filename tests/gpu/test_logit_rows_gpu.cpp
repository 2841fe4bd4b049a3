// The row kernel of ops/logit_rows_ops.h against the ATen reference on CUDA: every draw's column
// holds its uniform in the fp64 CDF up to fp32 rounding (the reference's own choice may differ
// where a uniform lies that close to a boundary), the draws' log-probabilities and probabilities
// against fp64, and the greedy column (exact) and log-sum-exp.
// Recipe vocabulary, bf16 and fp32, temperatures 1 and 0.7, a peaked row, a vocabulary that is
// not a multiple of the kernel's 8-column loads and rows that are not 16-byte aligned.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdio>

#include "common/parity.h"
#include "common/require_cuda.h"
#include "ops/logit_rows_ops.h"

namespace dspine::ops {
namespace {

struct RowCase {
  int64_t rows = 48;
  int64_t vocab = 151936;
  int64_t draws = 8;
  torch::Dtype dtype = torch::kBFloat16;
  double logits_scale = 1.0;
  double temperature = 1.0;
  double spread = 3.0;        // standard deviation of the logits
  int64_t column_offset = 0;  // > 0: rows viewed from column offset of a wider matrix
};

at::Tensor make_logits(const RowCase& c) {
  torch::manual_seed(11);
  auto wide = (torch::randn({c.rows, c.vocab + c.column_offset}) * c.spread)
                  .to(torch::Device(torch::kCUDA), c.dtype);
  return wide.narrow(1, c.column_offset, c.vocab);
}

// Whether `column` holds `target` in the fp64 CDF `cdf` of its row, up to `slack` of the total.
bool holds(const at::Tensor& cdf, int64_t column, double target, double slack) {
  const double below = column == 0 ? 0.0 : cdf[column - 1].item<double>();
  return below - slack <= target && target < cdf[column].item<double>() + slack;
}

void expect_draws_match(const RowCase& c) {
  auto logits = make_logits(c);
  torch::manual_seed(12);
  auto uniforms = torch::rand({c.rows, c.draws}, torch::kFloat64).to(logits.device());
  const auto fused = sample_logit_rows(logits, uniforms, c.logits_scale, c.temperature, true);
  const auto reference = sample_logit_rows(logits, uniforms, c.logits_scale, c.temperature, false);

  auto z = logits.to(torch::kFloat64);
  auto cdf = torch::softmax(z * (c.logits_scale / c.temperature), -1).cumsum(-1).cpu();
  auto u = uniforms.to(torch::kFloat32).to(torch::kFloat64).cpu();
  auto fused_choices = fused.choices.cpu(), reference_choices = reference.choices.cpu();
  int64_t differ = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t g = 0; g < c.draws; ++g) {
      // The kernel's column holds the uniform up to its fp32 scan's rounding (~91 additions of
      // fp32 terms in a row's prefix: < 1e-5 of the total); the reference's may sit on the
      // other side of a boundary within its own rounding.
      const int64_t mine = fused_choices[r][g].item<int64_t>();
      const double target = u[r][g].item<double>();
      EXPECT_TRUE(holds(cdf[r], mine, target, 1e-5))
          << "row " << r << " draw " << g << ": column " << mine << " does not hold u " << target
          << " (reference: " << reference_choices[r][g].item<int64_t>() << ")";
      differ += mine != reference_choices[r][g].item<int64_t>();
    }
  }
  std::printf("draws on another column than the reference's: %lld of %lld\n",
              static_cast<long long>(differ), static_cast<long long>(c.rows * c.draws));

  // Log-probabilities and probabilities of the kernel's own choices, against fp64.
  auto policy = torch::log_softmax(z * c.logits_scale, -1).gather(1, fused.choices);
  auto sampling = torch::softmax(z * (c.logits_scale / c.temperature), -1).gather(1, fused.choices);
  EXPECT_LE(testing::max_abs_diff(fused.logprobs, policy), 2e-5);
  EXPECT_LE(testing::max_relative_diff(fused.probs, sampling, 0.0), 1e-5);
}

TEST(LogitRowsGpu, DrawsMatchTheReferenceBf16) {
  REQUIRE_CUDA();
  expect_draws_match(RowCase{});
}

TEST(LogitRowsGpu, DrawsMatchTheReferenceFp32AtATemperature) {
  REQUIRE_CUDA();
  RowCase c;
  c.dtype = torch::kFloat32;
  c.logits_scale = 1.3;
  c.temperature = 0.7;
  expect_draws_match(c);
}

TEST(LogitRowsGpu, DrawsMatchOnPeakedUnalignedRows) {
  REQUIRE_CUDA();
  RowCase c;
  c.vocab = 260 * 7 + 3;  // not a multiple of 8: the tail columns load one by one
  c.column_offset = 1;    // rows 2 bytes past 16-byte alignment: scalar loads throughout
  c.spread = 12;          // most rows put nearly all mass on a few columns
  c.draws = 33;
  expect_draws_match(c);
}

// The greedy column is exact (the first maximum); log-sum-exp within fp32 rounding.
TEST(LogitRowsGpu, ArgmaxAndLogSumExpMatchTheReference) {
  REQUIRE_CUDA();
  for (auto dtype : {torch::kBFloat16, torch::kFloat32}) {
    RowCase c;
    c.dtype = dtype;
    auto logits = make_logits(c);
    logits[3].fill_(0.5);  // a row of ties: the first column wins
    const auto [argmax, lse] = logit_row_argmax_lse(logits, true);
    const auto [reference_argmax, reference_lse] = logit_row_argmax_lse(logits, false);
    EXPECT_TRUE(torch::equal(argmax, reference_argmax)) << c10::toString(dtype);
    EXPECT_EQ(argmax[3].item<int64_t>(), 0);
    EXPECT_LE(testing::max_abs_diff(lse, reference_lse), 1e-5) << c10::toString(dtype);
  }
}

TEST(LogitRowsGpu, RejectsCpuLogitsAndTooManyDraws) {
  REQUIRE_CUDA();
  auto cpu = torch::randn({2, 10});
  EXPECT_THROW(sample_logit_rows(cpu, torch::rand({2, 3}), 1, 1, true), std::exception);
  auto cuda = cpu.cuda();
  EXPECT_THROW(sample_logit_rows(cuda, torch::rand({2, 1025}), 1, 1, true), std::exception);
  EXPECT_THROW(sample_logit_rows(cuda, torch::rand({3, 2}), 1, 1, true), std::exception);
}

}  // namespace
}  // namespace dspine::ops
