// Fused GSPO seam and monolithic vocab path against the reference (docs/gspo.md, "The seam") on
// CUDA: fp32 to 1e-5, bf16 logits to 5e-3, bitwise-equal repeated runs, and clear errors.
#include <gtest/gtest.h>

#include <string>

#include <torch/torch.h>

#include "common/expect_error.h"
#include "common/require_cuda.h"
#include "core/error.h"
#include "ops/gspo_seam.h"

namespace dspine::ops {
namespace {

using dspine::testing::expect_error;

struct Inputs {
  at::Tensor logprobs;
  GspoTokens tokens;
  int64_t num_segments;
};

// Contiguous segments of random lengths (some ids unused, some segments fully masked, a masked
// tail with out-of-range ids), 20% masked tokens carrying non-finite values. Each segment's
// log-ratio is one of ±0.6, ±0.1, 0.4 so no segment sits near the clip boundary 1 ± 0.2.
// Log-probs and advantages are on a 2^-8 / 2^-6 grid and label counts are rounded up to a power
// of two, so every segment sum is exact in fp32 whatever the summation order: the fused and the
// reference (float-atomic index_add_) sums must then agree bitwise.
Inputs make_inputs(int64_t num_tokens, int64_t num_segments, at::ScalarType segment_type,
                   at::ScalarType count_type, uint64_t seed) {
  torch::manual_seed(seed);
  const auto cuda = torch::kCUDA;
  const int64_t body = num_tokens - num_tokens / 16;
  // Sorted random run starts over [0, body): segment k = number of starts <= t, ids spread out.
  auto starts = std::get<0>(torch::randint(body, {num_segments / 2 + 1}, torch::kInt64).sort());
  auto run = torch::searchsorted(starts, torch::arange(body, torch::kInt64), false, true);
  auto segment = (run * 2 + 1).clamp_max(num_segments - 1);  // even ids never used
  auto pad = torch::full({num_tokens - body}, num_segments + 5, torch::kInt64);
  segment = torch::cat({segment, pad});
  auto masked = torch::rand({num_tokens}).lt(0.2) | segment.ge(num_segments);  // tail masked
  if (num_segments > 2) masked = masked | segment.eq(num_segments - 1);  // a fully masked segment
  auto target = torch::where(masked, torch::full({}, -100, torch::kInt64),
                             torch::randint(1000, {num_tokens}, torch::kInt64));
  auto labelled = torch::zeros({num_segments + 6}, torch::kInt64)
                      .index_add_(0, segment, masked.logical_not().to(torch::kInt64));
  auto pow2 = torch::pow(2.0, torch::log2(labelled.clamp_min(1).to(torch::kFloat64)).ceil());
  auto counts = pow2.to(torch::kInt64).index_select(0, segment);
  auto grid = [](const at::Tensor& x, double step) { return (x / step).round() * step; };
  const auto offsets = grid(torch::tensor({-0.6, -0.1, 0.1, 0.4, 0.6}), 1.0 / 256);
  auto old = grid(torch::randn({num_tokens}) * 0.5 - 2, 1.0 / 256);
  auto lp = old + offsets.index_select(0, segment % 5).to(torch::kFloat32);
  auto advantage = grid(torch::randn({num_tokens}).clamp(-1.9, 1.9), 1.0 / 64);
  old = torch::where(masked, torch::full({}, NAN), old);
  lp = torch::where(masked, torch::full({}, -INFINITY), lp);
  advantage = torch::where(masked, torch::full({}, INFINITY), advantage);
  Inputs in;
  in.logprobs = lp.to(cuda);
  in.tokens = {target.to(cuda), old.to(cuda), advantage.to(cuda), segment.to(segment_type).to(cuda),
               counts.to(count_type).to(cuda)};
  in.num_segments = num_segments;
  return in;
}

GspoSeamParams params_for(int64_t num_segments, double scale, std::optional<double> g) {
  GspoSeamParams p;
  p.num_segments = num_segments;
  p.eps_low = 0.2;
  p.eps_high = 0.2;
  p.divisor = 7.0;
  p.logits_scale = scale;
  p.grad_output = g;
  return p;
}

void expect_close(const at::Tensor& got, const at::Tensor& want, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const auto g = got.to(torch::kFloat64).cpu(), w = want.to(torch::kFloat64).cpu();
  const auto excess = (g - w).abs() - (w.abs() * rtol + atol);
  EXPECT_LE(excess.max().item<double>(), 0.0)
      << what << ": max |diff| " << (g - w).abs().max().item<double>();
}

void expect_scalars_close(const GspoSeamResult& got, const GspoSeamResult& want, const std::string& what) {
  auto near = [&](const at::Tensor& a, const at::Tensor& b, const char* name) {
    const double x = a.item<double>(), y = b.item<double>();
    EXPECT_NEAR(x, y, std::max(1e-5 * std::abs(y), 1e-5)) << what << " " << name;
  };
  near(got.loss, want.loss, "loss");
  near(got.new_logprobs, want.new_logprobs, "new_logprobs");
  near(got.clipped_fraction, want.clipped_fraction, "clipped_fraction");
  near(got.ratio_mean, want.ratio_mean, "ratio_mean");
}

TEST(GspoGpu, FusedSeamMatchesReference) {
  REQUIRE_CUDA();
  auto comm = dist::make_single_process_communicator();
  struct Shape { int64_t tokens, segments; at::ScalarType seg, count; };
  for (const Shape& shape : {Shape{17, 4, torch::kInt64, torch::kInt64}, Shape{200, 16, torch::kInt32, torch::kFloat32},
                             Shape{4099, 1, torch::kInt64, torch::kInt32}, Shape{70001, 1024, torch::kInt32, torch::kInt64},
                             Shape{1 << 20, 65536, torch::kInt64, torch::kInt64}, Shape{(1 << 21) + 3, 1024, torch::kInt32, torch::kInt32},
                             // segments spanning dozens of blocks
                             Shape{(1 << 20) + 5, 4, torch::kInt64, torch::kFloat32},
                    // several tiles per block: runs ending exactly on a tile boundary
                    Shape{(1 << 22) + 7, 65536, torch::kInt64, torch::kInt64}}) {
    const Inputs in = make_inputs(shape.tokens, shape.segments, shape.seg, shape.count, shape.tokens);
    for (double scale : {1.0, 4.0}) {
      for (std::optional<double> g : {std::optional<double>(), std::optional<double>(4.0)}) {
        const auto p = params_for(shape.segments, scale, g);
        const std::string what = "N=" + std::to_string(shape.tokens) + " S=" + std::to_string(shape.segments) +
                                 " λ=" + std::to_string(scale) + (g ? " g=4" : " g=none");
        const auto want = gspo_segment_seam(in.logprobs, in.tokens, p, *comm, GspoBackend::kReference);
        const auto got = gspo_segment_seam(in.logprobs, in.tokens, p, *comm, GspoBackend::kFused);
        expect_scalars_close(got, want, what);
        EXPECT_TRUE(torch::equal(got.segment_sums, want.segment_sums)) << what << " sums (exact)";
        ASSERT_EQ(got.coefficient.defined(), g.has_value()) << what;
        if (g) expect_close(got.coefficient, want.coefficient, 1e-5, 1e-8, what + " c");
      }
    }
  }
}

TEST(GspoGpu, FusedSeamIsBitwiseDeterministic) {
  REQUIRE_CUDA();
  auto comm = dist::make_single_process_communicator();
  const Inputs in = make_inputs(1 << 20, 1024, torch::kInt64, torch::kInt64, 3);
  const auto p = params_for(1024, 4.0, 1.0);
  const auto a = gspo_segment_seam(in.logprobs, in.tokens, p, *comm, GspoBackend::kFused);
  const auto b = gspo_segment_seam(in.logprobs, in.tokens, p, *comm, GspoBackend::kFused);
  EXPECT_TRUE(torch::equal(a.segment_sums, b.segment_sums));
  EXPECT_TRUE(torch::equal(a.coefficient, b.coefficient));
  EXPECT_EQ(a.loss.item<float>(), b.loss.item<float>());
  EXPECT_EQ(a.new_logprobs.item<float>(), b.new_logprobs.item<float>());
}

// The spanning form (reduce, all-reduce, finish) against the reference and against the local
// form, which must agree bitwise (same kernels up to the [2, S] buffer, same per-token c).
TEST(GspoGpu, FusedSeamAllReducesOnceWhenSegmentsSpanRanks) {
  REQUIRE_CUDA();
  auto comm = dist::make_single_process_communicator();
  for (const auto& [tokens, segments] : {std::pair<int64_t, int64_t>{5000, 64}, {1 << 20, 65536},
                                         {(1 << 22) + 7, 1024}}) {
    const Inputs in = make_inputs(tokens, segments, torch::kInt64, torch::kInt64, 9);
    auto p = params_for(segments, 1.0, 1.0);
    const auto local = gspo_segment_seam(in.logprobs, in.tokens, p, *comm, GspoBackend::kFused);
    p.segments_span_ranks = true;
    const int64_t before = comm->collective_count();
    const auto got = gspo_segment_seam(in.logprobs, in.tokens, p, *comm, GspoBackend::kFused);
    EXPECT_EQ(comm->collective_count(), before + 1);
    const auto want = gspo_segment_seam(in.logprobs, in.tokens, p, *comm, GspoBackend::kReference);
    const std::string what = "span N=" + std::to_string(tokens) + " S=" + std::to_string(segments);
    expect_scalars_close(got, want, what);
    expect_close(got.coefficient, want.coefficient, 1e-5, 1e-8, what + " c");
    EXPECT_TRUE(torch::equal(got.coefficient, local.coefficient)) << what << " c vs local";
    EXPECT_TRUE(torch::equal(got.segment_sums, local.segment_sums)) << what << " sums vs local";
  }
}

TEST(GspoGpu, FusedSeamReportsBadInputs) {
  REQUIRE_CUDA();
  auto comm = dist::make_single_process_communicator();
  const Inputs in = make_inputs(3000, 16, torch::kInt64, torch::kInt64, 4);
  const auto p = params_for(16, 1.0, 1.0);
  const int64_t labelled = in.tokens.target.ge(0).nonzero()[0][0].item<int64_t>();
  GspoTokens bad = in.tokens;
  bad.segment = in.tokens.segment.clone();
  bad.segment[labelled] = 16;
  expect_error([&] { gspo_segment_seam(in.logprobs, bad, p, *comm, GspoBackend::kFused); },
               "segment id outside [0, num_segments=16)");
  // The last labelled token joins the first token's segment, far from that segment's run.
  const int64_t last = in.tokens.target.ge(0).nonzero()[-1][0].item<int64_t>();
  ASSERT_NE(in.tokens.segment[last].item<int64_t>(), in.tokens.segment[labelled].item<int64_t>());
  GspoTokens split = in.tokens;
  split.segment = in.tokens.segment.clone();
  split.segment[last] = in.tokens.segment[labelled];
  expect_error([&] { gspo_segment_seam(in.logprobs, split, p, *comm, GspoBackend::kFused); },
               "not one contiguous run");
  GspoTokens nonfinite = in.tokens;
  nonfinite.old_logprobs = in.tokens.old_logprobs.clone();
  nonfinite.old_logprobs[labelled] = NAN;
  expect_error([&] { gspo_segment_seam(in.logprobs, nonfinite, p, *comm, GspoBackend::kFused); },
               "non-finite");
}

// Splits far apart in a large input (hundreds of blocks): a token of one segment's run moved into
// another's, whether those runs lie inside one block or cross a block boundary, is reported by
// both forms.
TEST(GspoGpu, FusedSeamReportsSplitSegmentsAtScale) {
  REQUIRE_CUDA();
  auto comm = dist::make_single_process_communicator();
  const Inputs in = make_inputs(1 << 20, 1024, torch::kInt64, torch::kInt64, 11);
  const auto labelled = in.tokens.target.ge(0).nonzero().squeeze(1);
  const int64_t count = labelled.size(0);
  for (const auto& [from, to] : {std::pair<double, double>{0.1, 0.3}, {0.1, 0.9}, {0.5, 0.3}, {0.7, 0.71}}) {
    const int64_t source = labelled[int64_t(from * count)].item<int64_t>();
    const int64_t moved = labelled[int64_t(to * count)].item<int64_t>();
    ASSERT_NE(in.tokens.segment[source].item<int64_t>(), in.tokens.segment[moved].item<int64_t>());
    GspoTokens split = in.tokens;
    split.segment = in.tokens.segment.clone();
    split.segment[moved] = in.tokens.segment[source];
    for (bool span : {false, true}) {
      auto p = params_for(1024, 1.0, 1.0);
      p.segments_span_ranks = span;
      SCOPED_TRACE("token " + std::to_string(moved) + " into the segment of token " + std::to_string(source) +
                   (span ? ", spanning form" : ", local form"));
      expect_error([&] { gspo_segment_seam(in.logprobs, split, p, *comm, GspoBackend::kFused); },
                   "not one contiguous run");
    }
  }
}

// Monolithic fused vs the chunked reference on fp32 logits of the same values (bf16 upcast is
// exact), so bf16 results carry only the output rounding.
void check_monolithic(at::ScalarType dtype, int64_t rows, int64_t vocab, double scale, bool accumulate) {
  auto comm = dist::make_single_process_communicator();
  const Inputs in = make_inputs(rows, 64, torch::kInt64, torch::kInt64, rows + vocab);
  const auto mask = in.tokens.target.ge(0).unsqueeze(1);
  GspoTokens tokens = in.tokens;
  tokens.target = torch::where(in.tokens.target.ge(0), in.tokens.target % vocab, in.tokens.target);
  auto logits = (torch::randn({rows, vocab}, torch::kCUDA) * 3).to(dtype);
  logits = torch::where(mask, logits, torch::full({}, INFINITY, logits.options()));
  const auto p = params_for(64, scale, 4.0);
  // Old log-probs from the reference's own log-probs keep every ratio away from the clip range.
  const auto probe = gspo_vocab_seam(logits.to(torch::kFloat32), tokens, p, *comm, nullptr, false, GspoBackend::kReference);
  const auto offsets = torch::tensor({-0.6, -0.1, 0.1, 0.4, 0.6}, torch::kCUDA).to(torch::kFloat32);
  tokens.old_logprobs = torch::where(in.tokens.target.ge(0),
                                     probe.logprobs - offsets.index_select(0, tokens.segment.clamp(0, 1 << 20) % 5),
                                     in.tokens.old_logprobs);
  const auto initial = torch::randn({rows, vocab}, torch::kCUDA).to(dtype);
  at::Tensor want_grad = initial.to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);
  const auto want = gspo_vocab_seam(logits.to(torch::kFloat32), tokens, p, *comm, &want_grad, accumulate,
                                    GspoBackend::kReference, 1000);
  at::Tensor grad = initial.clone();
  const auto got = gspo_vocab_seam(logits, tokens, p, *comm, &grad, accumulate, GspoBackend::kFused);
  const std::string what = std::string(c10::toString(dtype)) + " V=" + std::to_string(vocab) +
                           " λ=" + std::to_string(scale) + (accumulate ? " accumulate" : " overwrite");
  const double tol = dtype == torch::kFloat32 ? 1e-5 : 5e-3;
  expect_scalars_close(got.seam, want.seam, what);
  expect_close(got.logprobs.masked_select(mask.squeeze(1)), want.logprobs.masked_select(mask.squeeze(1)), 1e-5, 1e-5, what + " lp");
  expect_close(got.seam.coefficient, want.seam.coefficient, 1e-5, 1e-8, what + " c");
  // An accumulated gradient is rounded at the scale of its terms: the floor follows the new term.
  const double floor = accumulate ? tol * (want_grad - initial.to(torch::kFloat32)).abs().max().item<double>() : 1e-7;
  expect_close(grad, want_grad, tol, floor, what + " grad");
  if (accumulate) {
    EXPECT_TRUE(torch::equal(grad.index({mask.squeeze(1).logical_not()}), initial.index({mask.squeeze(1).logical_not()})))
        << what << ": masked rows must be left untouched";
  }
  at::Tensor again = initial.clone();
  gspo_vocab_seam(logits, tokens, p, *comm, &again, accumulate, GspoBackend::kFused);
  EXPECT_TRUE(torch::equal(again, grad)) << what << ": two runs must be bitwise equal";
}

TEST(GspoGpu, MonolithicMatchesReferenceFp32) {
  REQUIRE_CUDA();
  for (int64_t vocab : {int64_t(1001), int64_t(4096)})
    for (double scale : {1.0, 4.0})
      for (bool accumulate : {false, true}) check_monolithic(torch::kFloat32, 777, vocab, scale, accumulate);
}

TEST(GspoGpu, MonolithicMatchesReferenceBf16) {
  REQUIRE_CUDA();
  for (int64_t vocab : {int64_t(1001), int64_t(32768)})
    for (bool accumulate : {false, true}) check_monolithic(torch::kBFloat16, 513, vocab, 4.0, accumulate);
}

TEST(GspoGpu, MonolithicReportsBadTarget) {
  REQUIRE_CUDA();
  auto comm = dist::make_single_process_communicator();
  const Inputs in = make_inputs(300, 8, torch::kInt64, torch::kInt64, 2);
  GspoTokens tokens = in.tokens;
  tokens.target = torch::where(in.tokens.target.ge(0), in.tokens.target % 50, in.tokens.target);
  tokens.target[tokens.target.ge(0).nonzero()[0][0].item<int64_t>()] = 50;
  const auto logits = torch::randn({300, 50}, torch::kCUDA);
  expect_error([&] { gspo_vocab_seam(logits, tokens, params_for(8, 1.0, 1.0), *comm, nullptr, false, GspoBackend::kFused); },
               "target id is outside [0, V)");
}

}  // namespace
}  // namespace dspine::ops
