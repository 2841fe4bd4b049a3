// The GSPO RL step on CPU: sampling, rewards and advantages on hand-built blocks, rollout
// determinism, the shared-row policy loss against the one-row-per-token seam and finite
// differences, and the objective's updates (ratios, clipping, KL).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include "common/dspine_tiny.h"
#include "common/expect_error.h"
#include "common/parity.h"
#include "common/policy_case.h"
#include "dist/communicator.h"
#include "objectives/gspo_objective.h"
#include "objectives/gspo_policy_loss.h"
#include "objectives/gspo_rollout.h"
#include "ops/logit_rows_ops.h"
#include "ops/vocab_objective_ops.h"

namespace dspine::objectives {
namespace {

using testing::draft_config;
using testing::mask_rows;
using testing::random_batch;
using testing::tiny_config;
using testing::tiny_settings;

at::Generator cpu_generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

TEST(GspoSampling, InverseCdfPicksTheBinHoldingTheUniform) {
  auto probs = torch::tensor({{0.2, 0.3, 0.5}, {0.0, 0.0, 2.0}}, torch::kFloat32);
  auto u = torch::tensor({{0.0, 0.19, 0.2, 0.49, 0.51, 0.999}, {0.0, 0.3, 0.5, 0.7, 0.9, 0.999}},
                         torch::kFloat64);
  auto index = ops::sample_categorical(probs, u);
  auto expected = torch::tensor({{0, 0, 1, 1, 2, 2}, {2, 2, 2, 2, 2, 2}}, torch::kInt64);
  EXPECT_TRUE(torch::equal(index, expected)) << index;
}

TEST(GspoSampling, FrequenciesFollowTheProbabilities) {
  auto gen = cpu_generator(3);
  auto probs = torch::tensor({{0.1, 0.6, 0.3}}, torch::kFloat32);
  auto u = at::rand({1, 20000}, gen, torch::kFloat64);
  auto counts =
      torch::bincount(ops::sample_categorical(probs, u).view(-1), {}, 3).to(torch::kFloat64);
  EXPECT_TRUE(torch::allclose(counts / 20000.0, probs.to(torch::kFloat64).view(-1), 0, 0.015))
      << counts;
}

// One block of T = 4 slots, the target's tokens 5 6 7 8 (shared by the group); samples chosen by
// hand.
struct HandBlock {
  torch::Tensor labels = torch::tensor({{{5, 6, 7, 8}}}, torch::kInt64);
  torch::Tensor all = torch::tensor({{true, true, true, true}});
};

TEST(GspoReward, GreedyMatchCountsTheAcceptedPrefix) {
  HandBlock b;
  auto tokens = torch::tensor({{{5, 6, 7, 8},      // full match
                                {4, 6, 7, 8},      // first-slot miss
                                {5, 6, 0, 8},      // miss in the middle
                                {5, 6, 7, 1}}},    // last-slot miss
                              torch::kInt64);
  auto accepted = accepted_prefix(tokens, b.labels, b.all);
  EXPECT_TRUE(torch::equal(accepted, torch::tensor({{4, 0, 2, 3}}, torch::kInt64))) << accepted;
}

TEST(GspoReward, MaskedTailAndSequenceEndStopTheCount) {
  HandBlock b;
  auto tokens = torch::tensor({{{5, 6, 7, 8}}}, torch::kInt64);
  // A loss-masked slot stops the chain (the supervision mask is cumulative).
  auto masked_tail = torch::tensor({{true, true, false, false}});
  EXPECT_EQ(accepted_prefix(tokens, b.labels, masked_tail).item<int64_t>(), 2);
  // A block at the end of the sequence: layout_blocks supervises only the slots inside it.
  auto ids = torch::tensor({{1, 2, 3, 4, 5, 6}}, torch::kInt64);
  auto mask = torch::ones({1, 6}, torch::kFloat32);
  auto anchors = torch::tensor({{3}}, torch::kInt64);
  auto layout = layout_blocks(ids, mask, anchors, torch::tensor({{true}}), 5, 0.0);
  auto labels = layout.labels.slice(2, 1).reshape({1, 4});
  auto supervised = layout.supervised.reshape({1, 4});
  EXPECT_TRUE(torch::equal(supervised, torch::tensor({{true, true, false, false}})));
  auto sampled = labels.unsqueeze(1).clone();  // the true tokens, and what the clamp repeats
  EXPECT_EQ(accepted_prefix(sampled, labels.unsqueeze(1), supervised).item<int64_t>(), 2);
}

TEST(GspoReward, ExpectedAcceptanceMultipliesClampedRatios) {
  auto supervised = torch::tensor({{true, true, true, false}});
  auto teacher = torch::tensor({{{0.5, 0.2, 0.9, 0.9}}}, torch::kFloat32);
  auto draft = torch::tensor({{{0.25, 0.4, 0.3, 0.1}}}, torch::kFloat32);
  // ratios min(1, p/q): 1, 0.5, 1, (masked) → prefix products 1, 0.5, 0.5, 0 → 2 / T = 0.5.
  auto reward = expected_acceptance(teacher, draft, supervised);
  EXPECT_NEAR(reward.item<float>(), 0.5f, 1e-6);
}

TEST(GspoAdvantage, GroupStdAndGroupMean) {
  auto rewards = torch::tensor({{0.0, 0.5, 1.0}, {0.25, 0.25, 0.25}}, torch::kFloat32);
  auto std_adv = group_advantages(rewards, GspoAdvantageNorm::kGroupStd);
  EXPECT_TRUE(torch::allclose(std_adv[0], torch::tensor({-1.0f, 0.0f, 1.0f}), 1e-5, 1e-5))
      << std_adv;
  // All-equal rewards: advantage 0, no NaN.
  EXPECT_TRUE(torch::equal(std_adv[1], torch::zeros({3})));
  auto mean_adv = group_advantages(rewards, GspoAdvantageNorm::kGroupMean);
  EXPECT_TRUE(torch::allclose(mean_adv[0], torch::tensor({-0.5f, 0.0f, 0.5f})));
  EXPECT_TRUE(torch::equal(mean_adv[1], torch::zeros({3})));
}

// Shared rows: R rows, G samples each, segments (row block, sample) as the backbone update lays
// them out; some rows masked.
GspoPolicySamples shared_samples(int64_t blocks, int64_t slots, int64_t group, int64_t vocab,
                                 uint64_t seed) {
  torch::manual_seed(seed);
  const int64_t rows = blocks * slots;
  GspoPolicySamples s;
  s.targets = torch::randint(0, vocab, {rows, group}, torch::kInt64);
  s.targets.select(1, 1).copy_(s.targets.select(1, 0));  // a token drawn twice in one row
  auto masked = torch::zeros({rows}, torch::kBool);
  masked[slots - 1] = true;  // the last slot of block 0
  s.targets.masked_fill_(masked.unsqueeze(1), -100);
  s.old_logprobs = -torch::rand({rows, group}) * 3 - 0.5;
  s.advantages = torch::randn({blocks, 1, group}).expand({blocks, slots, group}).reshape({rows, group});
  s.segments = torch::arange(blocks * group).view({blocks, 1, group}).expand({blocks, slots, group})
                   .reshape({rows, group});
  auto labelled = (~masked).view({blocks, slots}).sum(1).view({blocks, 1, 1});
  s.label_counts = labelled.expand({blocks, slots, group}).reshape({rows, group});
  s.seam_order = torch::arange(rows * group).view({blocks, slots, group}).permute({0, 2, 1}).reshape(-1);
  s.num_segments = blocks * group;
  return s;
}

GspoSeamParams wide_clip(double divisor) {
  GspoSeamParams p;
  p.logits_scale = 1.3;
  p.eps_low = 0.2;
  p.eps_high = 0.28;
  p.divisor = divisor;
  return p;
}

TEST(GspoPolicyLoss, SharedRowsMatchOneRowPerToken) {
  auto comm = dist::make_single_process_communicator();
  const int64_t blocks = 3, slots = 4, group = 3, vocab = 11;
  auto s = shared_samples(blocks, slots, group, vocab, 5);
  auto logits = torch::randn({blocks * slots, vocab}, torch::requires_grad());
  auto params = wide_clip(7.0);
  auto shared = gspo_policy_loss(logits, s, params, *comm, GspoBackend::kReference);
  shared.loss.backward();

  // Reference: every token gets its own copy of its row, in seam order, through the plain seam.
  auto flat_rows = torch::arange(blocks * slots).unsqueeze(1).expand({blocks * slots, group}).reshape(-1);
  auto order = s.seam_order;
  auto copies = logits.detach().index_select(0, flat_rows.index_select(0, order)).requires_grad_();
  auto pick = [&](const torch::Tensor& t) { return t.reshape(-1).index_select(0, order); };
  ops::GspoTokens tokens{pick(s.targets), pick(s.old_logprobs), pick(s.advantages), pick(s.segments),
                    pick(s.label_counts)};
  params.num_segments = s.num_segments;
  params.grad_output = 1.0;
  auto grad_copies = torch::zeros_like(copies);
  auto plain = ops::gspo_vocab_seam(copies.detach(), tokens, params, *comm, &grad_copies, false,
                               GspoBackend::kReference);
  EXPECT_NEAR(shared.loss.item<double>(), plain.seam.loss.item<double>(), 1e-6);
  EXPECT_NEAR(shared.seam.clipped_fraction.item<double>(), plain.seam.clipped_fraction.item<double>(), 1e-7);
  auto expected = torch::zeros_like(logits).index_add_(0, flat_rows.index_select(0, order), grad_copies);
  EXPECT_TRUE(torch::allclose(logits.grad(), expected, 1e-5, 1e-7))
      << (logits.grad() - expected).abs().max();
}

TEST(GspoPolicyLoss, GradientMatchesFiniteDifferences) {
  auto comm = dist::make_single_process_communicator();
  const int64_t blocks = 2, slots = 3, group = 2, vocab = 7;
  auto s = shared_samples(blocks, slots, group, vocab, 9);
  torch::manual_seed(2);
  auto base = torch::randn({blocks * slots, vocab}, torch::kFloat64).to(torch::kFloat32);
  auto params = wide_clip(4.0);
  // Old log-probs near the current ones keep every ratio inside the clip range (no kink).
  {
    auto lp = torch::log_softmax(base * params.logits_scale, 1).gather(1, s.targets.clamp_min(0));
    s.old_logprobs = (lp + 0.05 * torch::randn(lp.sizes())).to(torch::kFloat32);
  }
  auto logits = base.clone().requires_grad_();
  gspo_policy_loss(logits, s, params, *comm, GspoBackend::kReference).loss.backward();
  auto loss_at = [&](const torch::Tensor& z) {
    return gspo_policy_loss(z, s, params, *comm, GspoBackend::kReference).loss.item<double>();
  };
  const double eps = 1e-2;
  double worst = 0;
  for (int64_t r = 0; r < logits.size(0); ++r) {
    for (int64_t v = 0; v < vocab; ++v) {
      auto up = base.clone(), down = base.clone();
      up[r][v] += eps;
      down[r][v] -= eps;
      const double numeric = (loss_at(up) - loss_at(down)) / (2 * eps);
      worst = std::max(worst, std::abs(numeric - logits.grad()[r][v].item<double>()));
    }
  }
  EXPECT_LT(worst, 2e-4);
}

// The back end resolves as the seam's (ops::gspo_fused_backend): kFused on CPU logits is refused.
TEST(GspoPolicyLoss, FusedBackEndRefusesCpuLogits) {
  auto comm = dist::make_single_process_communicator();
  auto s = shared_samples(2, 3, 2, 7, 9);
  auto logits = torch::randn({6, 7}, torch::requires_grad());
  testing::expect_error(
      [&] { gspo_policy_loss(logits, s, wide_clip(4.0), *comm, GspoBackend::kFused); },
      "the fused back end needs CUDA tensors, got cpu");
}

// The tiny DSpine draft as the policy.
struct TinyPolicy {
  core::Config config = tiny_config();
  GspoSettings settings;
  std::unique_ptr<GspoObjective> objective;
  data::DraftBatch batch;

  explicit TinyPolicy(GspoSampling sampling, GspoReward reward = GspoReward::kGreedyMatch) {
    config.objective.name = "gspo";
    settings.rollout.sampling = sampling;
    settings.rollout.reward = reward;
    settings.rollout.group_size = 3;
    settings.rollout.top_k = config.section<dspine::model::DSpineConfig>("model.dspine").top_k;
    settings.rollout.chunk_blocks = 2;
    settings.eps_low = 1e-3;
    settings.eps_high = 1e-3;
    torch::manual_seed(17);
    auto head = torch::randn({32, 16});
    auto embed = torch::randn({32, 16});
    objective = make_gspo_objective(draft_config(config), tiny_settings(2), settings,
                                    config.training.accumulation_steps, embed, head, torch::kCPU,
                                    torch::kFloat32);
    objective->on_fresh_start("");
    batch = random_batch(mask_rows({{0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
                                    {0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}}),
                         23);
  }

  DraftPass pass(const RowStreams& streams) { return pass(streams, batch); }
  DraftPass pass(const RowStreams& streams, const data::DraftBatch& rows) {
    DSpineTrainingModel model(tiny_settings(2), objective->draft(), torch::randn({32, 16}),
                              torch::randn({32, 16}));
    DSpineForwardOptions options;
    options.training = false;
    return model.draft_pass(rows, streams, options, true);
  }
};

// One window of `updates` SGD updates (lr 0.5) on the policy's batch: the window's metrics and
// the parameter gradients of its last update.
struct WindowRun {
  std::map<std::string, double> metrics;
  std::vector<torch::Tensor> last_grads;
};
WindowRun run_window(TinyPolicy& policy, int64_t updates) {
  auto comm = dist::make_single_process_communicator();
  StepContext context;
  context.comm = comm.get();
  context.seed = 99;
  torch::optim::SGD sgd(policy.objective->module()->parameters(), 0.5);
  policy.objective->begin_window({policy.batch}, context);
  WindowRun out;
  for (int64_t update = 0; update < updates; ++update) {
    context.update = update;
    auto step = policy.objective->micro_step(policy.batch, 0, context);
    step.loss.backward();
    out.last_grads.clear();
    for (const auto& p : policy.objective->module()->parameters())
      out.last_grads.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    sgd.step();
    sgd.zero_grad();
  }
  out.metrics = policy.objective->end_window(context);
  return out;
}

TEST(GspoRollout, SameSeedSameBlocksOtherSeedOtherBlocks) {
  for (auto sampling : {GspoSampling::kBackbone, GspoSampling::kRefinement}) {
    TinyPolicy policy(sampling, GspoReward::kExpectedAcceptance);
    auto run = [&](uint64_t seed) {
      torch::manual_seed(1);
      const RowStreams streams{seed, 0, 0};
      auto pass = policy.pass(streams);
      auto head = torch::randn({32, 16});
      return gspo_rollout(policy.batch, pass, *policy.objective->draft(), head,
                          policy.settings.rollout, TeacherVerifier(head, 2), streams);
    };
    auto a = run(11), b = run(11), c = run(12);
    EXPECT_TRUE(torch::equal(a.tokens, b.tokens));
    EXPECT_TRUE(torch::equal(a.old_logprobs, b.old_logprobs));
    EXPECT_TRUE(torch::equal(a.rewards, b.rewards));
    EXPECT_FALSE(torch::equal(a.tokens, c.tokens));
    const int64_t kept = a.keep.sum().item<int64_t>();
    EXPECT_EQ(a.tokens.sizes(), (std::vector<int64_t>{kept, 3, 3}));
    EXPECT_TRUE(a.rewards.ge(0).all().item<bool>() && a.rewards.le(1).all().item<bool>());
    EXPECT_TRUE(torch::isfinite(a.advantages).all().item<bool>());
    EXPECT_TRUE(a.old_logprobs.le(0).all().item<bool>());
  }
}

// No bad id travels: an id outside the vocabulary and a row's kNoDraw become token 0 in tokens
// and choices, and the check counts them and keeps the first outside id's place and value.
TEST(GspoRollout, ScreenReplacesIdsOutsideTheVocabularyAndRecordsTheFirst) {
  auto tokens =
      torch::tensor(std::vector<int64_t>{3, 31, 32, 5, ops::kNoDraw, 40, 0, 1}).view({2, 2, 2});
  auto choices = tokens.clone();
  const auto check = screen_draws(tokens, choices, 32);
  const auto want = torch::tensor({3, 31, 0, 5, 0, 0, 0, 1}, torch::kInt64).view({2, 2, 2});
  EXPECT_TRUE(torch::equal(tokens, want)) << tokens;
  EXPECT_TRUE(torch::equal(choices, want)) << choices;
  EXPECT_TRUE(torch::equal(check, torch::tensor({2.0, 2.0, 32.0, 1.0, 4.0}, torch::kFloat64)))
      << check;
  auto clean = torch::tensor({1, 2}, torch::kInt64).view({1, 1, 2});
  auto none = at::Tensor();
  const auto nothing = screen_draws(clean, none, 32);
  EXPECT_EQ(nothing[kDrawsOutside].item<double>(), 0.0);
  EXPECT_EQ(nothing[kDrawsUndrawn].item<double>(), 0.0);
  EXPECT_TRUE(torch::equal(clean, torch::tensor({1, 2}, torch::kInt64).view({1, 1, 2})));
}

// A rollout whose sampler drew outside the vocabulary stops the window before any update, on
// every rank, with the rank, micro-batch, batch row, anchor, slot and id in the message.
TEST(GspoObjective, ARolloutThatDrewOutsideTheVocabularyFailsTheWindow) {
  TinyPolicy policy(GspoSampling::kBackbone);
  auto comm = dist::make_single_process_communicator();
  StepContext context;
  context.comm = comm.get();
  context.seed = 99;
  policy.objective->begin_window({policy.batch}, context);  // a clean rollout adopts
  auto rollout = policy.objective->window_rollouts().at(0);
  ASSERT_GT(rollout.kept.numel(), 0);
  const int64_t group = rollout.tokens.size(1), slots = rollout.tokens.size(2);
  const int64_t m = rollout.kept[0].item<int64_t>(), anchors = rollout.anchors.size(1);
  const int64_t position = rollout.anchors[m / anchors][m % anchors].item<int64_t>();
  // As a sampler fault would leave it: the first kept block's second sample, slot 1, id 4096.
  rollout.draw_check = torch::tensor({1.0, double(slots + 1), 4096.0, 0.0, 0.0}, torch::kFloat64);
  try {
    policy.objective->adopt_rollouts({rollout}, context);
    FAIL() << "a rollout that drew outside the vocabulary was adopted";
  } catch (const WindowFailure& e) {
    const std::string message = e.what();
    const std::string where = fmt::format("batch row {}, anchor position {}, slot 1, sample 1 of {}",
                                          m / anchors, position, group);
    EXPECT_NE(message.find("rank 0, micro-batch 0: the rollout drew token id 4096 outside the "
                           "vocabulary [0, 32)"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find(where), std::string::npos) << message << "\nwanted: " << where;
  }
}

// A row samples its blocks from its own streams: the rollout of a batch's row equals the rollout
// of that row alone under the same global row number.
TEST(GspoRollout, RowsSampleTheSameBlocksInAnyGrouping) {
  for (auto sampling : {GspoSampling::kBackbone, GspoSampling::kRefinement}) {
    TinyPolicy policy(sampling, GspoReward::kGreedyMatch);
    const RowStreams streams{11, 3, 4};
    auto rollout = [&](const RowStreams& s, const data::DraftBatch& rows) {
      torch::manual_seed(1);
      auto pass = policy.pass(s, rows);
      auto head = torch::randn({32, 16});
      return gspo_rollout(rows, pass, *policy.objective->draft(), head, policy.settings.rollout,
                          TeacherVerifier(head, 2), s);
    };
    const auto both = rollout(streams, policy.batch);
    int64_t first = 0;
    for (int64_t row = 0; row < 2; ++row) {
      const auto& b = policy.batch;
      const auto alone = rollout(
          streams.rows_from(row),
          data::DraftBatch{b.input_ids.narrow(0, row, 1), b.loss_mask.narrow(0, row, 1),
                           b.hidden_states.narrow(0, row, 1),
                           b.target_last_hidden_states.narrow(0, row, 1)});
      const int64_t kept = alone.tokens.size(0);
      ASSERT_GT(kept, 0);
      EXPECT_TRUE(torch::equal(alone.tokens, both.tokens.narrow(0, first, kept)))
          << "sampling " << int(sampling) << " row " << row;
      first += kept;
    }
    EXPECT_EQ(first, both.tokens.size(0));
  }
}

TEST(GspoObjective, FirstUpdateIsOnPolicyAndLaterUpdatesClip) {
  for (auto sampling : {GspoSampling::kBackbone, GspoSampling::kRefinement}) {
    // A random draft matches almost no label: expected acceptance still ranks the samples.
    TinyPolicy policy(sampling, GspoReward::kExpectedAcceptance);
    policy.settings.updates_per_rollout = 2;
    policy.objective =
        make_gspo_objective(draft_config(policy.config), tiny_settings(2), policy.settings,
                            policy.config.training.accumulation_steps, torch::randn({32, 16}),
                            torch::randn({32, 16}), torch::kCPU, torch::kFloat32);
    policy.objective->on_fresh_start("");
    auto metrics = run_window(policy, 2).metrics;
    // The first update is on-policy (ratio 1, nothing clipped, KL 0); the second sees the moved
    // policy: the mean over the two updates shows ratios away from 1 and clipped segments.
    EXPECT_GT(metrics["gspo/clipped_fraction"], 0.0) << int(sampling);
    EXPECT_GT(std::abs(metrics["gspo/ratio_mean"] - 1.0), 1e-4) << int(sampling);
    EXPECT_GT(metrics["gspo/kl"], 0.0) << int(sampling);
    EXPECT_GE(metrics["gspo/accepted_length"], 1.0);
    EXPECT_TRUE(std::isfinite(metrics["loss"]));
  }
}

TEST(GspoObjective, OneUpdateIsOnPolicy) {
  TinyPolicy policy(GspoSampling::kBackbone, GspoReward::kExpectedAcceptance);
  auto comm = dist::make_single_process_communicator();
  StepContext context;
  context.comm = comm.get();
  context.seed = 99;
  policy.objective->begin_window({policy.batch}, context);
  auto out = policy.objective->micro_step(policy.batch, 0, context);
  out.loss.backward();
  auto metrics = policy.objective->end_window(context);
  EXPECT_NEAR(metrics["gspo/ratio_mean"], 1.0, 1e-6);
  EXPECT_EQ(metrics["gspo/clipped_fraction"], 0.0);
  EXPECT_NEAR(metrics["gspo/kl"], 0.0, 1e-7);
  // Some parameter gets a gradient through the seam.
  double norm = 0;
  for (const auto& p : policy.objective->module()->parameters()) {
    if (p.grad().defined()) norm += p.grad().norm().item<double>();
  }
  EXPECT_GT(norm, 0.0);
}

}  // namespace
}  // namespace dspine::objectives

namespace dspine::objectives {
namespace {

// The update moves the policy toward rewarded tokens: reward 1 for token 0, G = 8 samples per row
// from the current policy, group-std advantages; a few SGD steps on the seam's loss raise p(0).
TEST(GspoPolicyLoss, UpdatesRaiseTheProbabilityOfRewardedTokens) {
  auto comm = dist::make_single_process_communicator();
  auto gen = cpu_generator(21);
  const int64_t rows = 16, group = 8, vocab = 6;
  auto logits = torch::zeros({rows, vocab}, torch::requires_grad());
  torch::optim::SGD sgd({logits}, 20.0);
  auto p0 = [&] { return torch::softmax(logits.detach(), 1).select(1, 0).mean().item<double>(); };
  const double before = p0();
  for (int step = 0; step < 20; ++step) {
    auto probs = torch::softmax(logits.detach(), 1);
    auto tokens = ops::sample_categorical(probs, at::rand({rows, group}, gen, torch::kFloat64));
    auto rewards = tokens.eq(0).to(torch::kFloat32);  // each row's G samples are one group
    GspoPolicySamples s;
    s.targets = tokens;
    s.old_logprobs = torch::log_softmax(logits.detach(), 1).gather(1, tokens);
    s.advantages = group_advantages(rewards, GspoAdvantageNorm::kGroupStd);
    s.segments = torch::arange(rows * group).view({rows, group});
    s.label_counts = torch::ones({rows, group}, torch::kInt64);
    s.seam_order = torch::arange(rows * group);
    s.num_segments = rows * group;
    GspoSeamParams params;
    params.eps_low = 0.2;
    params.eps_high = 0.28;
    params.divisor = static_cast<double>(rows * group);
    sgd.zero_grad();
    gspo_policy_loss(logits, s, params, *comm, GspoBackend::kReference).loss.backward();
    sgd.step();
  }
  EXPECT_GT(p0(), before + 0.3) << "p(token 0) " << before << " -> " << p0();
}

}  // namespace
}  // namespace dspine::objectives

namespace dspine::objectives {
namespace {

// The policy term in the vocabulary row pass (ATen on the CPU) equals projecting the logits and
// the separate seam: loss, metrics, log-probs and the hidden states' gradient, for chunks of
// whole blocks (3 chunks of 2, 2, 1 blocks) and one chunk.
TEST(GspoRowPass, PolicyAloneMatchesTheSeparateSeam) {
  const int64_t blocks = 5, slots = 4, group = 3, vocab = 37, width = 8;
  const auto policy = testing::policy_case(blocks, slots, group, vocab, torch::kCPU);
  auto hidden = torch::randn({blocks * slots, width});
  auto head = torch::randn({vocab, width});
  for (int64_t chunk_rows : {int64_t(9), int64_t(0)}) {
    auto [row, ref] =
        testing::policy_alone(policy, hidden, head, chunk_rows, GspoBackend::kReference);
    EXPECT_NEAR(row.loss, ref.loss, 1e-6) << chunk_rows;
    EXPECT_NEAR(row.clipped_fraction, ref.clipped_fraction, 1e-6) << chunk_rows;
    EXPECT_NEAR(row.ratio_mean, ref.ratio_mean, 1e-6) << chunk_rows;
    EXPECT_NEAR(row.new_logprobs, ref.new_logprobs, 1e-5) << chunk_rows;
    EXPECT_LT(testing::max_abs_diff(row.logprobs, ref.logprobs), 1e-5) << chunk_rows;
    EXPECT_LT(testing::max_relative_diff(row.grad, ref.grad, 0.0), 1e-5) << chunk_rows;
    EXPECT_GT(ref.clipped_fraction, 0.0);  // the clip acts on some segment
    EXPECT_GT(ref.grad.abs().max().item<double>(), 0.0);
  }
}

// With the supervised terms in the same pass, the loss and gradient are the supervised ones plus
// ρ times the policy's: one dX GEMM for both.
TEST(GspoRowPass, SupervisedAndPolicyShareOneGradient) {
  const int64_t blocks = 5, slots = 4, group = 3, vocab = 37, width = 8, rows = blocks * slots;
  auto policy = testing::policy_case(blocks, slots, group, vocab, torch::kCPU);
  policy.loss_scale = 2.5;
  auto hidden = torch::randn({rows, width});
  auto teacher = torch::randn({rows, width});
  auto labels = torch::randint(0, vocab, {rows}, torch::kInt64);
  auto weights = torch::rand({rows});
  auto head = torch::randn({vocab, width});
  ops::VocabObjectiveOptions options;
  options.ce_weight = 0.3;
  options.chunk_rows = 9;
  auto run = [&](const ops::VocabPolicy* with) {
    auto h = hidden.clone().requires_grad_();
    auto o = options;
    o.policy = with;
    auto out = ops::vocab_objective(h, teacher, labels, weights, head, o);
    out.loss.backward();
    return std::make_pair(out.loss.item<double>(), h.grad());
  };
  auto [both_loss, both_grad] = run(&policy);
  auto [supervised_loss, supervised_grad] = run(nullptr);
  policy.loss_scale = 1.0;
  auto [row, ref] = testing::policy_alone(policy, hidden, head, 9, GspoBackend::kReference);
  EXPECT_NEAR(both_loss, supervised_loss + 2.5 * ref.loss, 1e-5);
  const auto expected = supervised_grad + 2.5 * ref.grad;
  EXPECT_LT(testing::max_relative_diff(both_grad, expected, 0.0), 1e-5);
}

// GspoObjective's update through the row pass (use_fused_vocabulary) equals the separate seam's,
// with and without the supervised term: same loss, metrics and parameter gradients.
TEST(GspoObjective, RowPassUpdateMatchesTheSeparateSeam) {
  for (double ce_weight : {0.0, 0.5}) {
    std::vector<std::map<std::string, double>> metrics;
    std::vector<std::vector<torch::Tensor>> grads;
    for (bool row_pass : {false, true}) {
      TinyPolicy policy(GspoSampling::kBackbone, GspoReward::kExpectedAcceptance);
      policy.settings.ce_weight = ce_weight;
      policy.settings.updates_per_rollout = 2;
      torch::manual_seed(5);
      policy.objective =
          make_gspo_objective(draft_config(policy.config), tiny_settings(2), policy.settings,
                              policy.config.training.accumulation_steps, torch::randn({32, 16}),
                              torch::randn({32, 16}), torch::kCPU, torch::kFloat32);
      policy.objective->on_fresh_start("");
      policy.objective->training_model().use_fused_vocabulary(row_pass);
      auto window = run_window(policy, 2);
      metrics.push_back(window.metrics);
      grads.push_back(window.last_grads);
    }
    for (const char* key : {"loss", "gspo/loss", "gspo/clipped_fraction", "gspo/ratio_mean",
                            "gspo/kl", "gspo/new_logprobs"}) {
      EXPECT_NEAR(metrics[1].at(key), metrics[0].at(key), 1e-5 * (1 + std::abs(metrics[0].at(key))))
          << key << " ce_weight " << ce_weight;
    }
    if (ce_weight > 0) {
      EXPECT_NEAR(metrics[1].at("gspo/dspine_loss"), metrics[0].at("gspo/dspine_loss"), 1e-5);
    }
    EXPECT_GT(metrics[0].at("gspo/clipped_fraction"), 0.0);
    for (size_t i = 0; i < grads[0].size(); ++i) {
      EXPECT_LE(testing::max_relative_diff(grads[1][i], grads[0][i], 1e-6), 1e-5)
          << "parameter " << i << " ce_weight " << ce_weight;
    }
  }
}

}  // namespace
}  // namespace dspine::objectives
