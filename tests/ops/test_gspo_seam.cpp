// The reference GSPO seam and monolithic path (CPU) against an independent oracle: a plain loop
// over segments in fp64 with autograd (docs/gspo.md, "The seam"), over its edge cases.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include <torch/torch.h>

#include "common/expect_error.h"
#include "common/parity.h"
#include "core/error.h"
#include "ops/gspo_seam.h"

namespace dspine::ops {
namespace {

using dspine::testing::expect_allclose;
using dspine::testing::expect_error;

struct Layout {
  const char* name;
  std::vector<int64_t> lengths;  // consecutive runs of tokens
  std::vector<int64_t> ids;      // segment id of each run
  int64_t num_segments;
  int64_t pad_tail;              // masked padding tokens (segment id −1) at the end
  std::set<int64_t> fully_masked;
};

// Edge-case layouts (docs/gspo.md, "The seam"): uneven lengths; one segment; segments never used
// (1, 4, 7, 8, 11, 13, 14) and a fully masked one (6); a padded tail. Layout "rows" is a [2, 33]
// batch flattened, so segment 6 spans the two rows.
std::vector<Layout> layouts() {
  return {
      {"uneven", {17, 31, 58, 94}, {0, 1, 2, 3}, 4, 0, {}},
      {"single", {50}, {0}, 1, 7, {}},
      {"sparse16", {5, 1, 9, 3, 17, 2, 8, 4, 6}, {0, 2, 3, 5, 6, 9, 10, 12, 15}, 16, 11, {6}},
      {"rows", {20, 10, 21}, {3, 6, 9}, 16, 15, {}},
  };
}

// Per-segment log-ratio offsets: R ∈ {0.55, 0.90, 1.05, 1.13, 1.49}, far from 1 ± 0.2.
constexpr double kOffsets[] = {-0.6, -0.1, 0.05, 0.12, 0.4};

struct Case {
  at::Tensor logprobs;
  GspoTokens tokens;
  int64_t num_segments;
};

// Masked tokens carry non-finite logprobs / old logprobs / advantages (select, not multiply).
Case make_case(const Layout& layout, uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<int64_t> segment, target;
  std::vector<float> old, advantage, lp;
  std::vector<int64_t> labelled(layout.num_segments, 0);
  auto noise = torch::randn({4096}, torch::kFloat64);
  auto coin = torch::rand({4096}, torch::kFloat64);
  auto noise_at = noise.accessor<double, 1>();
  auto coin_at = coin.accessor<double, 1>();
  int64_t k = 0;
  for (size_t run = 0; run < layout.lengths.size(); ++run) {
    const int64_t id = layout.ids[run];
    for (int64_t i = 0; i < layout.lengths[run]; ++i, ++k) {
      const bool masked = layout.fully_masked.count(id) > 0 || coin_at[k] < 0.2;
      segment.push_back(id);
      target.push_back(masked ? -100 : (k * 7) % 37);
      const double o = -2.0 + 0.5 * noise_at[k];
      old.push_back(masked ? NAN : static_cast<float>(o));
      lp.push_back(masked ? -INFINITY : static_cast<float>(o + kOffsets[id % 5]));
      advantage.push_back(masked ? INFINITY : static_cast<float>(noise_at[4095 - k]));
      if (!masked) ++labelled[id];
    }
  }
  for (int64_t i = 0; i < layout.pad_tail; ++i) {
    segment.push_back(-1);
    target.push_back(-100);
    old.push_back(NAN);
    lp.push_back(NAN);
    advantage.push_back(NAN);
  }
  std::vector<int64_t> counts;
  for (int64_t s : segment) counts.push_back(s >= 0 ? labelled[s] : 0);
  auto tensor64 = [](const std::vector<int64_t>& v) { return torch::tensor(v, torch::kInt64); };
  auto tensor32 = [](const std::vector<float>& v) { return torch::tensor(v, torch::kFloat32); };
  Case c;
  c.logprobs = tensor32(lp);
  c.tokens = {tensor64(target), tensor32(old), tensor32(advantage), tensor64(segment).to(torch::kInt32),
              tensor64(counts)};
  c.num_segments = layout.num_segments;
  return c;
}

struct Oracle {
  at::Tensor loss;  // fp64 scalar with the graph back to the log-probs
  double new_logprobs = 0, clipped = 0, ratio = 0;
};

// The seam's math (docs/gspo.md) written per segment, in fp64, straight from the definitions.
Oracle segment_loop(const at::Tensor& lp, const GspoTokens& tokens, const GspoSeamParams& p) {
  const auto target = tokens.target.accessor<int64_t, 1>();
  const auto segment = tokens.segment.to(torch::kInt64);
  const auto seg = segment.accessor<int64_t, 1>();
  const auto counts = tokens.label_counts.to(torch::kFloat64);
  const auto old = tokens.old_logprobs.to(torch::kFloat64);
  const auto adv = tokens.advantages.to(torch::kFloat64);
  const double low = 1 - p.eps_low, high = 1 + p.eps_high;
  Oracle o;
  o.loss = torch::zeros({}, torch::kFloat64);
  for (int64_t s = 0; s < p.num_segments; ++s) {
    std::vector<int64_t> members;
    for (int64_t t = 0; t < target.size(0); ++t)
      if (target[t] >= 0 && seg[t] == s) members.push_back(t);
    if (members.empty()) continue;
    const auto idx = torch::tensor(members, torch::kInt64);
    const double n = std::max(counts[members[0]].item<double>(), 1.0);
    const auto u = (lp.index_select(0, idx) - old.index_select(0, idx)).sum() / n;
    const double a = adv.index_select(0, idx).sum().item<double>() / n;
    const auto r = u.exp();
    const auto clipped_r = r.clamp(low, high);
    const auto loss_s = -torch::minimum(r * a, clipped_r * a);
    o.loss = o.loss + loss_s * static_cast<double>(members.size());
    const double rv = r.item<double>();
    const double share = static_cast<double>(members.size()) / n;
    o.new_logprobs += lp.index_select(0, idx).sum().item<double>() / n;
    o.clipped += (rv < low || rv > high) ? share : 0.0;
    o.ratio += rv * share;
  }
  o.loss = o.loss / p.divisor;
  o.new_logprobs /= p.divisor;
  o.clipped /= p.divisor;
  o.ratio /= p.divisor;
  return o;
}

void expect_scalar(const at::Tensor& got, double want, const std::string& what) {
  EXPECT_NEAR(got.item<double>(), want, std::max(1e-5 * std::abs(want), 1e-5)) << what;
}

GspoSeamParams base_params(int64_t num_segments) {
  GspoSeamParams p;
  p.num_segments = num_segments;
  p.eps_low = 0.2;
  p.eps_high = 0.2;
  p.divisor = 3.0;
  return p;
}

TEST(GspoSeam, ReferenceMatchesSegmentLoopWithAutograd) {
  auto comm = dist::make_single_process_communicator();
  for (const Layout& layout : layouts()) {
    const Case c = make_case(layout, 7);
    for (double scale : {1.0, 4.0}) {
      for (std::optional<double> g : {std::optional<double>(), std::optional<double>(1.0),
                                      std::optional<double>(4.0)}) {
        GspoSeamParams p = base_params(c.num_segments);
        p.logits_scale = scale;
        p.grad_output = g;
        const std::string what = std::string(layout.name) + " λ=" + std::to_string(scale) +
                                 " g=" + (g ? std::to_string(*g) : "none");
        const auto r = gspo_segment_seam(c.logprobs, c.tokens, p, *comm, GspoBackend::kReference);
        auto lp = c.logprobs.to(torch::kFloat64).requires_grad_(true);
        const Oracle o = segment_loop(lp, c.tokens, p);
        expect_scalar(r.loss, o.loss.item<double>(), what + " loss");
        expect_scalar(r.new_logprobs, o.new_logprobs, what + " new_logprobs");
        expect_scalar(r.clipped_fraction, o.clipped, what + " clipped_fraction");
        expect_scalar(r.ratio_mean, o.ratio, what + " ratio_mean");
        EXPECT_GT(o.clipped, 0.0) << what << ": the case must exercise clipping";
        if (!g) {
          EXPECT_FALSE(r.coefficient.defined()) << what;
          continue;
        }
        o.loss.backward();
        // c_t = −λ·∂(g·L)/∂lp_t (∂L/∂lp_t = −c_t/λ).
        const auto expected = -scale * *g * lp.grad();
        expect_allclose(r.coefficient, expected, 1e-5, 1e-8, what + " coefficient");
        EXPECT_EQ(comm->collective_count(), 0) << "no collective without segments_span_ranks";
      }
    }
  }
}

TEST(GspoSeam, NonFiniteMaskedInputsDoNotPoisonSums) {
  auto comm = dist::make_single_process_communicator();
  const Case c = make_case(layouts()[2], 11);
  GspoSeamParams p = base_params(c.num_segments);
  p.grad_output = 1.0;
  const auto mask = c.tokens.target.ge(0);
  GspoTokens clean = c.tokens;
  clean.old_logprobs = torch::where(mask, c.tokens.old_logprobs, torch::zeros({}));
  clean.advantages = torch::where(mask, c.tokens.advantages, torch::zeros({}));
  const auto clean_lp = torch::where(mask, c.logprobs, torch::zeros({}));
  ASSERT_FALSE(c.logprobs.isfinite().all().item<bool>());
  const auto dirty = gspo_segment_seam(c.logprobs, c.tokens, p, *comm, GspoBackend::kReference);
  const auto reference = gspo_segment_seam(clean_lp, clean, p, *comm, GspoBackend::kReference);
  EXPECT_TRUE(dirty.loss.isfinite().item<bool>());
  EXPECT_TRUE(dirty.coefficient.isfinite().all().item<bool>());
  EXPECT_TRUE(torch::equal(dirty.segment_sums, reference.segment_sums));
  EXPECT_TRUE(torch::equal(dirty.coefficient, reference.coefficient));
  EXPECT_EQ(dirty.loss.item<float>(), reference.loss.item<float>());
}

TEST(GspoSeam, UnusedAndFullyMaskedSegmentsContributeNothing) {
  auto comm = dist::make_single_process_communicator();
  const Case c = make_case(layouts()[2], 3);
  GspoSeamParams p = base_params(c.num_segments);
  p.grad_output = 1.0;
  const auto r = gspo_segment_seam(c.logprobs, c.tokens, p, *comm, GspoBackend::kReference);
  for (int64_t s : {1, 4, 6, 7, 8, 11, 13, 14}) {  // 6 is fully masked: N = 0 clamps to 1
    EXPECT_EQ(r.segment_sums[0][s].item<float>(), 0.f) << "segment " << s;  // R = 1
    EXPECT_EQ(r.segment_sums[1][s].item<float>(), 0.f) << "segment " << s;  // Ā = 0
  }
  const auto seg6 = c.tokens.segment.eq(6);
  EXPECT_TRUE(torch::equal(r.coefficient.masked_select(seg6), torch::zeros({seg6.sum().item<int64_t>()})));
  // More (unused) segment ids change nothing.
  GspoSeamParams wide = p;
  wide.num_segments = 64;
  const auto r64 = gspo_segment_seam(c.logprobs, c.tokens, wide, *comm, GspoBackend::kReference);
  EXPECT_EQ(r64.loss.item<float>(), r.loss.item<float>());
  EXPECT_TRUE(torch::equal(r64.coefficient, r.coefficient));
}

// A communicator for one simulated rank of two: all_reduce adds the other rank's local sums.
class PairCommunicator : public dist::Communicator {
 public:
  explicit PairCommunicator(at::Tensor other) : other_(std::move(other)) {}
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  std::string backend() const override { return "pair"; }
  bool reduces_device_tensors() const override { return true; }
  void all_reduce(at::Tensor& tensor, dist::ReduceOp op) override {
    ASSERT_EQ(op, dist::ReduceOp::kSum);
    tensor.add_(other_);
    count_collective(dist::Collective::kAllReduce, static_cast<int64_t>(tensor.nbytes()));
  }
  void broadcast(at::Tensor&, int) override { FAIL() << "unexpected broadcast"; }
  void all_gather(const at::Tensor&, at::Tensor&) override { FAIL() << "unexpected all_gather"; }
  void reduce_scatter(const at::Tensor&, at::Tensor&, dist::ReduceOp) override {
    FAIL() << "unexpected reduce_scatter";
  }
  void barrier() override {}

 private:
  at::Tensor other_;
};

TEST(GspoSeam, SegmentSplitOverTwoRanksMatchesSingleRank) {
  auto single = dist::make_single_process_communicator();
  const Case c = make_case(layouts()[0], 5);  // 200 tokens; the split cuts segment 2 (48..105)
  GspoSeamParams p = base_params(c.num_segments);
  p.grad_output = 4.0;
  p.logits_scale = 4.0;
  const auto whole = gspo_segment_seam(c.logprobs, c.tokens, p, *single, GspoBackend::kReference);
  const int64_t cut = 80;
  auto half = [&](int64_t begin, int64_t n) {
    GspoTokens t{c.tokens.target.narrow(0, begin, n), c.tokens.old_logprobs.narrow(0, begin, n),
                 c.tokens.advantages.narrow(0, begin, n), c.tokens.segment.narrow(0, begin, n),
                 c.tokens.label_counts.narrow(0, begin, n)};
    return std::make_pair(c.logprobs.narrow(0, begin, n), t);
  };
  const auto [lp0, t0] = half(0, cut);
  const auto [lp1, t1] = half(cut, c.logprobs.size(0) - cut);
  const auto local0 = gspo_segment_seam(lp0, t0, p, *single, GspoBackend::kReference).segment_sums;
  const auto local1 = gspo_segment_seam(lp1, t1, p, *single, GspoBackend::kReference).segment_sums;
  GspoSeamParams split = p;
  split.segments_span_ranks = true;
  PairCommunicator comm0(local1), comm1(local0);
  const auto r0 = gspo_segment_seam(lp0, t0, split, comm0, GspoBackend::kReference);
  const auto r1 = gspo_segment_seam(lp1, t1, split, comm1, GspoBackend::kReference);
  EXPECT_EQ(comm0.collective_count(), 1);
  EXPECT_EQ(comm1.collective_count(), 1);
  expect_scalar(r0.loss + r1.loss, whole.loss.item<double>(), "loss");
  expect_scalar(r0.new_logprobs + r1.new_logprobs, whole.new_logprobs.item<double>(), "new_logprobs");
  expect_scalar(r0.ratio_mean + r1.ratio_mean, whole.ratio_mean.item<double>(), "ratio_mean");
  expect_scalar(r0.clipped_fraction + r1.clipped_fraction, whole.clipped_fraction.item<double>(),
                "clipped_fraction");
  expect_allclose(torch::cat({r0.coefficient, r1.coefficient}), whole.coefficient, 1e-5, 1e-8, "c");
}

// Monolithic reference (chunked) against autograd through log_softmax in fp64.
void check_vocab(at::ScalarType dtype, double scale, bool accumulate, double tol) {
  auto comm = dist::make_single_process_communicator();
  const Case c = make_case(layouts()[3], 19);
  const int64_t n = c.logprobs.size(0), vocab = 37;
  torch::manual_seed(23);
  const auto mask = c.tokens.target.ge(0);
  const auto logits = (torch::randn({n, vocab}) * 2).to(dtype);
  // The oracle sees finite masked rows; the tested path sees +inf there (must be ignored).
  const auto dirty = torch::where(mask.unsqueeze(1), logits, torch::full({}, INFINITY).to(dtype));
  GspoTokens tokens = c.tokens;
  const auto x = logits.to(torch::kFloat64).requires_grad_(true);
  const auto lp = (x * scale).log_softmax(1).gather(1, tokens.target.clamp_min(0).unsqueeze(1)).squeeze(1);
  // Old log-probs put each segment's ratio at exp(offset) as in make_case.
  const auto seg64 = tokens.segment.to(torch::kInt64).clamp_min(0);
  const auto offsets = torch::tensor(std::vector<double>(std::begin(kOffsets), std::end(kOffsets)));
  tokens.old_logprobs = torch::where(mask, lp.detach() - offsets.index_select(0, seg64 % 5), torch::full({}, NAN, torch::kFloat64)).to(torch::kFloat32);
  GspoSeamParams p = base_params(c.num_segments);
  p.logits_scale = scale;
  p.grad_output = 4.0;
  const Oracle o = segment_loop(lp, tokens, p);
  (o.loss * *p.grad_output).backward();

  const auto initial = torch::randn({n, vocab}).to(dtype);
  at::Tensor grad = initial.clone();
  const auto r = gspo_vocab_seam(dirty, tokens, p, *comm, &grad, accumulate, GspoBackend::kReference,
                                 /*chunk_rows=*/7);
  const std::string what = std::string(c10::toString(dtype)) + (accumulate ? " accumulate" : " overwrite");
  expect_scalar(r.seam.loss, o.loss.item<double>(), what + " loss");
  auto expected = x.grad().where(mask.unsqueeze(1), torch::zeros({}, torch::kFloat64));
  if (accumulate) expected = torch::where(mask.unsqueeze(1), expected + initial.to(torch::kFloat64), initial.to(torch::kFloat64));
  expect_allclose(grad, expected, tol, tol * 1e-3, what + " grad");
  if (accumulate) {
    EXPECT_TRUE(torch::equal(grad.index({mask.logical_not()}), initial.index({mask.logical_not()})))
        << "masked rows must be left untouched";
  }
}

TEST(GspoSeam, VocabReferenceMatchesAutogradFp32) {
  for (double scale : {1.0, 4.0})
    for (bool accumulate : {false, true}) check_vocab(torch::kFloat32, scale, accumulate, 1e-5);
}

TEST(GspoSeam, VocabReferenceMatchesAutogradBf16) {
  for (bool accumulate : {false, true}) check_vocab(torch::kBFloat16, 4.0, accumulate, 5e-3);
}

TEST(GspoSeam, BadInputsRaiseClearErrors) {
  auto comm = dist::make_single_process_communicator();
  const Case c = make_case(layouts()[0], 1);
  GspoSeamParams p = base_params(c.num_segments);
  const int64_t labelled = c.tokens.target.ge(0).nonzero()[0][0].item<int64_t>();
  const int64_t masked = c.tokens.target.lt(0).nonzero()[0][0].item<int64_t>();

  GspoTokens bad = c.tokens;
  bad.segment = c.tokens.segment.clone();
  bad.segment[labelled] = 4;
  expect_error([&] { gspo_segment_seam(c.logprobs, bad, p, *comm, GspoBackend::kReference); },
               "labelled token " + std::to_string(labelled) + " has segment id 4 outside [0, num_segments=4)");
  bad.segment[labelled] = -3;
  expect_error([&] { gspo_segment_seam(c.logprobs, bad, p, *comm, GspoBackend::kReference); },
               "segment id -3");

  // Out-of-range ids at masked tokens are fine (and never indexed).
  GspoTokens padded = c.tokens;
  padded.segment = c.tokens.segment.clone();
  padded.segment[masked] = 1000;
  EXPECT_NO_THROW(gspo_segment_seam(c.logprobs, padded, p, *comm, GspoBackend::kReference));

  GspoTokens short_old = c.tokens;
  short_old.old_logprobs = c.tokens.old_logprobs.narrow(0, 0, 9);
  expect_error([&] { gspo_segment_seam(c.logprobs, short_old, p, *comm, GspoBackend::kReference); },
               "`old_logprobs` has 9 elements but logprobs has 200");

  GspoTokens nonfinite = c.tokens;
  nonfinite.advantages = c.tokens.advantages.clone();
  nonfinite.advantages[labelled] = NAN;
  expect_error([&] { gspo_segment_seam(c.logprobs, nonfinite, p, *comm, GspoBackend::kReference); },
               "`advantages` is non-finite (nan) at labelled token " + std::to_string(labelled));
  auto lp = c.logprobs.clone();
  lp[labelled] = INFINITY;
  expect_error([&] { gspo_segment_seam(lp, c.tokens, p, *comm, GspoBackend::kReference); },
               "`logprobs` is non-finite");

  GspoTokens wrong_dtype = c.tokens;
  wrong_dtype.segment = c.tokens.segment.to(torch::kFloat32);
  expect_error([&] { gspo_segment_seam(c.logprobs, wrong_dtype, p, *comm, GspoBackend::kReference); },
               "`segment` has dtype Float");

  const auto logits = torch::randn({200, 11});
  GspoTokens big_target = c.tokens;
  big_target.target = c.tokens.target.clone();
  big_target.target[labelled] = 11;
  expect_error([&] { gspo_vocab_seam(logits, big_target, p, *comm, nullptr, false, GspoBackend::kReference); },
               "target id 11 outside [0, V=11)");
  expect_error([&] { gspo_segment_seam(c.logprobs, c.tokens, p, *comm, GspoBackend::kFused); },
               "fused back end needs CUDA tensors");
}

}  // namespace
}  // namespace dspine::ops
