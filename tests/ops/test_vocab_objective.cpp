// The fused vocabulary objective's tensor front end on CPU (its ATen row pass): parity with the
// unfused autograd formulation (terms, per-row statistics, candidates, teacher probabilities, the
// hidden gradient) for several chunk sizes, and hand-built rows (p = q, zero weights, sign ties).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>

#include "common/parity.h"
#include "core/error.h"
#include "ops/vocab_objective_ops.h"
#include "ops/vocab_rows.h"

namespace dspine::ops {
namespace {

using testing::expect_close;

struct Inputs {
  torch::Tensor hidden, teacher, labels, weights, lm_head;
};

Inputs random_inputs(int64_t rows, int64_t hidden, int64_t vocab, uint64_t seed) {
  torch::manual_seed(seed);
  Inputs in;
  in.hidden = torch::randn({rows, hidden});
  in.teacher = torch::randn({rows, hidden});
  in.labels = torch::randint(0, vocab, {rows}, torch::kInt64);
  in.weights = torch::rand({rows});
  in.weights.index_put_({torch::arange(0, rows, 3)}, 0.0);  // masked rows
  in.lm_head = torch::randn({vocab, hidden}) * 0.5;
  return in;
}

// The unfused formulation: fp32 log-softmax and softmax at full width, differentiated by autograd.
struct Expected {
  torch::Tensor loss, ce, l1, argmax, candidates, teacher_candidates, grad;
};

Expected unfused(const Inputs& in, double cw, int64_t k) {
  auto x = in.hidden.detach().clone().requires_grad_(true);
  auto z = x.matmul(in.lm_head.t()).to(torch::kFloat32);
  auto log_p = torch::log_softmax(z, -1);
  auto q = torch::softmax(in.teacher.matmul(in.lm_head.t()).to(torch::kFloat32), -1);
  Expected e;
  e.ce = -log_p.gather(1, in.labels.unsqueeze(1)).squeeze(1);
  e.l1 = (log_p.exp() - q).abs().sum(-1);
  e.loss = (in.weights * (cw * e.ce + (1.0 - cw) * e.l1)).sum();
  e.loss.backward();
  e.grad = x.grad();
  e.argmax = z.argmax(-1);
  e.candidates = std::get<1>(z.detach().topk(k, -1, true, true));
  e.teacher_candidates = q.gather(1, e.candidates);
  return e;
}

TEST(VocabObjective, MatchesTheUnfusedTermsAndGradientForEveryChunkSize) {
  const auto in = random_inputs(23, 16, 97, 3);
  const double cw = 0.3;
  const auto e = unfused(in, cw, 5);
  for (int64_t chunk : {0, 1, 4, 23, 40}) {
    auto x = in.hidden.detach().clone().requires_grad_(true);
    VocabObjectiveOptions o;
    o.ce_weight = cw;
    o.top_k = 5;
    o.chunk_rows = chunk;
    auto r = vocab_objective(x, in.teacher, in.labels, in.weights, in.lm_head, o);
    ASSERT_TRUE(r.loss.requires_grad());
    EXPECT_FALSE(r.ce.requires_grad());
    r.loss.backward();
    const auto tag = "chunk " + std::to_string(chunk);
    expect_close(r.loss, e.loss, 1e-5, tag + " loss");
    expect_close(r.ce, e.ce.detach(), 1e-5, tag + " ce");
    expect_close(r.l1, e.l1.detach(), 1e-5, tag + " l1");
    expect_close(x.grad(), e.grad, 1e-5, tag + " grad");
    expect_close(r.teacher_candidates, e.teacher_candidates, 1e-5, tag + " teacher probs");
    EXPECT_TRUE(torch::equal(r.argmax, e.argmax)) << tag;
    EXPECT_TRUE(torch::equal(r.candidates, e.candidates)) << tag;
  }
}

// Teacher states by position, read through an index with repeats (DSpine's overlapping blocks):
// the same objective as the teacher gathered row by row, whatever the chunks' shares of positions.
TEST(VocabObjective, TeacherIndexEqualsTheGatheredTeacherForEveryChunkSize) {
  const auto in = random_inputs(31, 16, 97, 4);
  const auto states = torch::randn({12, 16});
  // Runs of nearby positions, as overlapping blocks read them, and one repeated far position.
  auto index = (torch::arange(31).div(3, "floor") + torch::randint(0, 3, {31})).clamp_max(11);
  index[30] = 0;
  Inputs gathered = in;
  gathered.teacher = states.index_select(0, index);
  const double cw = 0.3;
  const auto e = unfused(gathered, cw, 5);
  for (int64_t chunk : {0, 1, 4, 31}) {
    auto x = in.hidden.detach().clone().requires_grad_(true);
    VocabObjectiveOptions o;
    o.ce_weight = cw;
    o.top_k = 5;
    o.chunk_rows = chunk;
    auto r = vocab_objective(x, states, in.labels, in.weights, in.lm_head, o, index);
    r.loss.backward();
    const auto tag = "chunk " + std::to_string(chunk);
    expect_close(r.loss, e.loss, 1e-5, tag + " loss");
    expect_close(r.l1, e.l1.detach(), 1e-5, tag + " l1");
    expect_close(x.grad(), e.grad, 1e-5, tag + " grad");
    expect_close(r.teacher_candidates, e.teacher_candidates, 1e-5, tag + " teacher probs");
    EXPECT_TRUE(torch::equal(r.candidates, e.candidates)) << tag;
  }

  VocabObjectiveOptions o;
  auto outside = index.clone();
  outside[7] = 12;
  try {
    vocab_objective(in.hidden, states, in.labels, in.weights, in.lm_head, o, outside);
    FAIL() << "a teacher index outside the states must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("teacher_index 12 at row 7 is outside [0, 12)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(vocab_objective(in.hidden, states, in.labels, in.weights, in.lm_head, o,
                               index.slice(0, 1)),
               Error);
  EXPECT_THROW(vocab_objective(in.hidden, states.slice(1, 1), in.labels, in.weights, in.lm_head,
                               o, index),
               Error);
}

TEST(VocabObjective, BackwardScalesByTheIncomingGradientAndWithoutAutogradGivesNoGraph) {
  const auto in = random_inputs(9, 8, 33, 5);
  const auto e = unfused(in, 0.5, 2);
  VocabObjectiveOptions o;
  o.ce_weight = 0.5;
  o.top_k = 2;
  auto x = in.hidden.detach().clone().requires_grad_(true);
  auto r = vocab_objective(x, in.teacher, in.labels, in.weights, in.lm_head, o);
  (2.5 * r.loss).backward();
  expect_close(x.grad(), 2.5 * e.grad, 1e-5, "scaled grad");

  torch::NoGradGuard no_grad;
  auto plain = vocab_objective(x, in.teacher, in.labels, in.weights, in.lm_head, o);
  EXPECT_FALSE(plain.loss.requires_grad());
  expect_close(plain.loss, e.loss.detach(), 1e-5, "no-grad loss");
}

TEST(VocabObjective, CeOnlyFormMatchesTheUnfusedCe) {
  const auto in = random_inputs(17, 8, 65, 7);
  const auto e = unfused(in, 1.0, 1);
  for (int64_t chunk : {0, 3}) {
    VocabObjectiveOptions o;
    o.chunk_rows = chunk;
    auto r = vocab_ce(in.hidden, in.labels, in.lm_head, o);
    expect_close(r.ce, e.ce.detach(), 1e-5, "ce");
    EXPECT_TRUE(torch::equal(r.argmax, e.argmax));
  }
}

// Row-level gradient by autograd of w·(a_ce·ce + a_l1·Σ|softmax(z) − softmax(t)|), both softmaxes
// by the same function so that equal rows tie exactly (abs' derivative at 0 is 0).
torch::Tensor autograd_row_gradient(const torch::Tensor& z, const torch::Tensor& t,
                                    const torch::Tensor& labels, const torch::Tensor& w, double cw) {
  auto zz = z.detach().clone().requires_grad_(true);
  auto log_p = torch::log_softmax(zz, -1);
  auto l1 = (torch::softmax(zz, -1) - torch::softmax(t, -1)).abs().sum(-1);
  auto ce = -log_p.gather(1, labels.unsqueeze(1)).squeeze(1);
  (w * (cw * ce + (1 - cw) * l1)).sum().backward();
  return zz.grad();
}

TEST(VocabRows, HandBuiltRowsEqualTeacherZeroWeightAndSignTies) {
  // Row 0: p = q (l1 = 0, the L1 gradient vanishes). Row 1: weight 0 (gradient 0). Row 2: entries
  // 0 and 1 tie exactly (p = q = 1/3: exp(-30) rounds away from the sum of 3) while the mass of
  // entries 2 and 3 moves, so the gradient there depends on sign(0) = 0.
  auto z = torch::tensor({{1.f, 2.f, 0.5f, -1.f}, {3.f, 0.f, 0.f, 1.f}, {0.f, 0.f, 0.f, -30.f}});
  auto t = torch::tensor({{1.f, 2.f, 0.5f, -1.f}, {0.f, 1.f, 2.f, 3.f}, {0.f, 0.f, -30.f, 0.f}});
  auto labels = torch::tensor({1, 2, 0}, torch::kInt64);
  auto w = torch::tensor({0.7f, 0.f, 1.3f});
  const double cw = 0.25;
  const auto expected = autograd_row_gradient(z, t, labels, w, cw);

  auto g = z.clone();
  VocabRowGradient gradient{w, cw, 1 - cw};
  auto r = vocab_rows(g, t, labels, &gradient, false);
  EXPECT_EQ(r.l1[0].item<float>(), 0.f);
  auto p0 = torch::softmax(z[0], -1);
  auto ce_only = 0.7 * cw * (p0 - torch::one_hot(labels[0], 4).to(torch::kFloat32));
  expect_close(g[0], ce_only, 1e-7, "p = q row");
  EXPECT_TRUE(torch::equal(g[1], torch::zeros({4}))) << g[1];
  // p = (1/3, 1/3, 1/3, ~0), q = (1/3, 1/3, ~0, 1/3): S = 1/3 (it would be 1 with sign(0) = 1).
  EXPECT_NEAR(g[2][0].item<double>(), 1.3 * (cw * (1.0 / 3 - 1) - (1 - cw) / 9), 1e-6);
  EXPECT_NEAR(g[2][1].item<double>(), 1.3 * (cw / 3 - (1 - cw) / 9), 1e-6);
  expect_close(g, expected, 1e-6, "autograd");
  EXPECT_TRUE(torch::equal(r.argmax, torch::tensor({1, 0, 0}, torch::kInt64)));  // first maximum
}

// The GSPO policy term folded into the row pass's gradient (logits scale 1): the supervised
// gradient plus C_r·p − Σ_g c_{r,g}·δ_{y_{r,g}}, a token drawn twice in a row counted twice, a
// masked sample (target < 0) ignored, and a row of weight 0 still carrying its policy gradient.
TEST(VocabRows, PolicyGradientJoinsTheSupervisedOne) {
  torch::manual_seed(5);
  const int64_t rows = 4, vocab = 7;
  auto z = torch::randn({rows, vocab});
  auto t = torch::randn({rows, vocab});
  auto labels = torch::tensor({1, 2, 0, 6}, torch::kInt64);
  auto w = torch::tensor({0.7f, 0.f, 1.3f, 0.4f});
  auto targets =
      torch::tensor({{3, 3, 5}, {0, 6, 6}, {-100, -100, -100}, {2, 4, 1}}, torch::kInt64);
  auto coefficients = torch::tensor(
      {{0.2f, -0.1f, 0.3f}, {0.5f, 0.25f, -0.4f}, {0.f, 0.f, 0.f}, {-0.3f, 0.1f, 0.6f}});
  VocabRowGradient supervised{w, 0.25, 0.75};
  auto g_supervised = z.clone();
  vocab_rows(g_supervised, t, labels, &supervised, false);

  VocabRowGradient both = supervised;
  both.policy_total = coefficients.sum(1);
  both.policy_targets = targets;
  both.policy_coefficients = coefficients;
  auto g = z.clone();
  vocab_rows(g, t, labels, &both, false);

  auto expected = g_supervised + torch::softmax(z, -1) * coefficients.sum(1, true);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < targets.size(1); ++k) {
      const int64_t y = targets[r][k].item<int64_t>();
      if (y >= 0) expected[r][y] -= coefficients[r][k];
    }
  }
  expect_close(g, expected, 1e-6, "supervised + policy");
  EXPECT_GT(g[1].abs().max().item<double>(), 0.1) << "weight 0 keeps the policy gradient";
  expect_close(g[2], g_supervised[2], 0.0, "a masked row is the supervised gradient alone");
}

TEST(VocabRows, ReferenceCandidatesAreAStableDescendingTopKWithTeacherProbabilities) {
  // Row 0: 2.0 at 1 and 3 tie inside the set (index order). Row 1: all equal: the first k.
  // Row 2: NaN ranks first (as torch.topk); 0.5 at 3 and 4 tie across the 2nd place and +0 at 0
  // and -0 at 2 across the 4th: the lower index enters.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto z = torch::tensor({{1.f, 2.f, -1.f, 2.f, 0.5f, 0.f},
                          {3.f, 3.f, 3.f, 3.f, 3.f, 3.f},
                          {0.f, nan, -0.f, 0.5f, 0.5f, -2.f}});
  auto t = torch::tensor({{0.f, 1.f, 2.f, 3.f, 4.f, 5.f},
                          {1.f, -1.f, 0.f, 2.f, 0.f, 0.f},
                          {-3.f, 0.f, 1.f, 0.25f, 0.f, 2.f}});
  auto labels = torch::zeros({3}, torch::kInt64);
  for (int64_t k : {1, 2, 4}) {
    auto g = z.clone();
    const auto r = vocab_rows(g, t, labels, nullptr, false, k);
    const auto expected = torch::tensor({{1, 3, 0, 4}, {0, 1, 2, 3}, {1, 3, 4, 0}}, torch::kInt64)
                              .narrow(1, 0, k);
    EXPECT_TRUE(torch::equal(r.candidates, expected)) << "k " << k << "\n" << r.candidates;
    const auto q = torch::softmax(t, -1).gather(1, expected);
    expect_close(r.teacher_candidates, q, 1e-7, "teacher probabilities, k " + std::to_string(k));
  }
  // Plain topk agrees wherever its order is fixed (no ties): row 0 with k = 1.
  auto g = z.clone();
  EXPECT_EQ(vocab_rows(g, t, labels, nullptr, false, 1).candidates[0][0].item<int64_t>(),
            std::get<1>(z[0].topk(1)).item<int64_t>());
  EXPECT_FALSE(vocab_rows(g, t, labels, nullptr, false).candidates.defined());
  EXPECT_THROW(vocab_rows(g, t, labels, nullptr, false, 7), Error);
}

TEST(VocabObjective, BadInputsNameWhatIsWrong) {
  const auto in = random_inputs(4, 8, 16, 9);
  VocabObjectiveOptions o;
  auto bad_labels = in.labels.clone();
  bad_labels[2] = 16;
  try {
    vocab_objective(in.hidden, in.teacher, bad_labels, in.weights, in.lm_head, o);
    FAIL() << "a label outside the vocabulary must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 16 at row 2 is outside [0, 16)"), std::string::npos)
        << e.what();
  }
  // With teacher states by position, the label checks are read with the chunks' positions; a bad
  // label and a bad position name the label (the first check), on every path (CE-only too).
  const auto states = torch::randn({3, 8});
  auto bad_index = torch::tensor({0, 1, 3, 2}, torch::kInt64);
  for (const auto& index : {torch::tensor({0, 1, 2, 2}, torch::kInt64), bad_index}) {
    try {
      vocab_objective(in.hidden, states, bad_labels, in.weights, in.lm_head, o, index);
      FAIL() << "a label outside the vocabulary must throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("label 16 at row 2 is outside [0, 16)"),
                std::string::npos)
          << e.what();
    }
  }
  try {
    vocab_ce(in.hidden, bad_labels, in.lm_head, o);
    FAIL() << "a label outside the vocabulary must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 16 at row 2 is outside [0, 16)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(vocab_objective(in.hidden, in.teacher.slice(0, 1), in.labels, in.weights,
                               in.lm_head, o),
               Error);
  EXPECT_THROW(vocab_ce(in.hidden.slice(1, 1), in.labels, in.lm_head, o), Error);
  o.top_k = 17;
  EXPECT_THROW(vocab_objective(in.hidden, in.teacher, in.labels, in.weights, in.lm_head, o), Error);
}

}  // namespace
}  // namespace dspine::ops
