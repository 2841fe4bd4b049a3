// The row kernel of ops/logit_rows_ops.h against the ATen reference on CUDA: every draw's column
// holds its uniform in the fp64 CDF up to fp32 rounding (the reference's own choice may differ
// where a uniform lies that close to a boundary), the draws' log-probabilities and probabilities
// against fp64, and the greedy column (exact) and log-sum-exp.
// Recipe vocabulary, bf16 and fp32, temperatures 1 and 0.7, a peaked row, a vocabulary that is
// not a multiple of the kernel's 8-column loads and rows that are not 16-byte aligned. Then the
// row that drew a column past the vocabulary before the kernel offered only columns of nonzero
// probability (docs/kernels.md, "Draws from rows of logits"), and over 10 million draws from
// adversarial rows, each a column in [0, V) of nonzero probability.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

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

// The smallest row found that drew outside the vocabulary (column 320 of V = 260, as in the gpu
// testbed's GSPO runs): one unit of mass at column 56 and w = e^-17.5 ≈ 0.84·2^-25 at the first
// column of each later group of 64 (256 is the last group, cut at 260). The block scan's prefix
// before group 5 rounds 1 + 4w up to 1 + 2^-23 while the running sum through group 4 rounds to 1,
// and the row total, summed in yet another order, is 1 + 2^-23: the uniform just below 1 puts
// the target at 1, in that gap, where only threads past the vocabulary used to pass it.
TEST(LogitRowsGpu, TheGapRowDrawsInsideTheVocabulary) {
  REQUIRE_CUDA();
  const float inf = std::numeric_limits<float>::infinity();
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto row = torch::full({1, 260}, -inf);
    row[0][56] = 0.0f;
    for (int64_t col : {64, 128, 192, 256}) row[0][col] = -17.5f;
    auto logits = row.to(torch::Device(torch::kCUDA), dtype);
    const double below_one = std::nextafter(1.0f, 0.0f);
    auto uniforms = torch::tensor({{below_one, 0.5, 0.0}}, torch::kFloat64).cuda();
    const auto draws = sample_logit_rows(logits, uniforms, 1.0, 1.0, /*fused=*/true);
    const auto choices = draws.choices.cpu();
    EXPECT_EQ(choices[0][0].item<int64_t>(), 256) << c10::toString(dtype);  // the last of mass
    EXPECT_EQ(choices[0][1].item<int64_t>(), 56) << c10::toString(dtype);
    EXPECT_EQ(choices[0][2].item<int64_t>(), 56) << c10::toString(dtype);
    EXPECT_TRUE((draws.probs > 0).all().item<bool>()) << draws.probs;
  }
}

// Adversarial rows: one-hot, mass in the first or last column, −inf everywhere but one entry,
// denormal weights, ties, the gap row's pattern at random places and scales, and plain random
// rows; each row with random uniforms and the 16 floats just below 1. Every draw is a column in
// [0, V) whose logit is finite and whose probability the kernel reports > 0.
struct Adversary {
  int64_t vocab;
  torch::Dtype dtype;
  double logits_scale, temperature;
};

at::Tensor adversarial_rows(int64_t rows, int64_t vocab, torch::Generator& gen) {
  const float inf = std::numeric_limits<float>::infinity();
  auto z = torch::randn({rows, vocab}, gen) * 3;
  auto column = [&](int64_t r) { return torch::randint(vocab, {1}, gen).item<int64_t>(); };
  for (int64_t r = 0; r < rows; ++r) {
    auto row = z[r];
    switch (r % 8) {
      case 0: row.fill_(-inf); row[column(r)] = 0.0f; break;               // one finite entry
      case 1: row.fill_(-inf); row[0] = 1.0f; row[vocab - 1] = -90.0f; break;
      case 2: row.fill_(-200.0f); row[vocab - 1] = 0.0f; break;            // mass in the last
      case 3: row.fill_(-95.0f); row[0] = 0.0f; break;                     // denormal tail
      case 4: row.fill_(0.5f); break;                                      // all tied
      case 5: {                                                            // the gap pattern
        row.fill_(-inf);
        row[column(r)] = 0.0f;
        const float w = -17.0f - torch::rand({1}, gen).item<float>();
        row.slice(0, column(r) % 64, vocab, 64).fill_(w);
        break;
      }
      case 6: row.mul_(8); break;                                          // sharply peaked
      default: break;                                                      // random
    }
  }
  return z;
}

TEST(LogitRowsGpu, TenMillionAdversarialDrawsStayInsideTheVocabulary) {
  REQUIRE_CUDA();
  const std::vector<Adversary> cases = {
      {260, torch::kBFloat16, 1.0, 1.0},    {260, torch::kFloat32, 1.0, 1.0},
      {261, torch::kBFloat16, 1.3, 0.7},    {2049, torch::kFloat32, 1.0, 0.05},
      {1823, torch::kBFloat16, 2.0, 3.0},   {151936, torch::kBFloat16, 1.0, 1.0},
      {151936, torch::kFloat32, 1.0, 0.7},
  };
  int64_t total = 0;
  for (const auto& c : cases) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(c.vocab + 7);
    const int64_t rows = c.vocab > 10000 ? 256 : 2048, draws = 1024;
    auto logits = adversarial_rows(rows, c.vocab, gen).to(torch::Device(torch::kCUDA), c.dtype);
    auto uniforms = torch::rand({rows, draws}, gen, torch::kFloat64);
    for (int64_t k = 1; k <= 16; ++k)
      uniforms.select(1, k - 1).fill_(1.0 - std::ldexp(double(k), -24));
    const auto out = sample_logit_rows(logits, uniforms.cuda(), c.logits_scale, c.temperature,
                                       /*fused=*/true);
    const auto inside = out.choices.ge(0) & out.choices.lt(c.vocab);
    const auto safe = out.choices.clamp(0, c.vocab - 1);
    const auto finite = logits.gather(1, safe).to(torch::kFloat32).isfinite();
    const auto bad = (inside & finite & out.probs.gt(0)).logical_not();
    const int64_t failures = bad.sum().item<int64_t>();
    if (failures > 0) {
      const auto at = bad.view(-1).nonzero()[0][0].item<int64_t>();
      ADD_FAILURE() << "V " << c.vocab << " " << c10::toString(c.dtype) << ": " << failures
                    << " bad draws; the first at row " << at / draws << ", column "
                    << out.choices.view(-1)[at].item<int64_t>() << ", probability "
                    << out.probs.view(-1)[at].item<float>();
    }
    total += rows * draws;
  }
  std::printf("%lld adversarial draws checked\n", static_cast<long long>(total));
  EXPECT_GE(total, 10'000'000);
}

// NaN or +inf in a row, or no finite value: nothing to draw from, and the row is named.
TEST(LogitRowsGpu, RowsWithoutFiniteLogitsDrawNothingAndAreNamed) {
  REQUIRE_CUDA();
  const float inf = std::numeric_limits<float>::infinity();
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto logits = torch::randn({4, 3000});
    logits[1][2999] = std::nanf("");
    logits[2].fill_(-inf);
    logits[3][5] = inf;
    const auto draws = sample_logit_rows(logits.to(torch::Device(torch::kCUDA), dtype),
                                         torch::rand({4, 3}, torch::kFloat64).cuda(), 1.0, 1.0,
                                         /*fused=*/true);
    const auto choices = draws.choices.cpu();
    EXPECT_TRUE(choices[0].ge(0).all().item<bool>());
    for (int64_t r : {1, 2, 3}) {
      EXPECT_TRUE(choices[r].eq(kNoDraw).all().item<bool>()) << r << ": " << choices[r];
      EXPECT_TRUE(torch::isnan(draws.probs[r]).all().item<bool>()) << r;
    }
    try {
      check_rows_drawn(draws.choices, "rollout");
      FAIL() << "a row of NaN was not named";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("row 1 of the logits"), std::string::npos) << e.what();
    }
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
