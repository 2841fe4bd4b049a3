// GSPO across two ranks (MPI on the CPU; DSPINE_TEST_DEVICE=cuda: NCCL on one GPU per rank).
// 1. A segment split over the ranks: the spanning seam's one all-reduce of the [2, S] sums gives
//    every rank the single-rank loss share and logits gradient of its rows.
// 2. The objective: two ranks updating their rows of one rollout give, after the trainer's SUM
//    all-reduce, the gradients of one rank updating the concatenated batch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/choice_named.h"
#include "common/dspine_tiny.h"
#include "dist/launch.h"
#include "dist/mpi_context.h"
#include "objectives/gspo_objective.h"
#include "objectives/gspo_policy_loss.h"

namespace dspine {
namespace {

using objectives::GspoBackend;
using objectives::GspoPolicySamples;

std::string test_device() {
  const char* device = std::getenv("DSPINE_TEST_DEVICE");
  return device == nullptr ? "cpu" : device;
}

torch::Device device_of_rank() {
  return dist::training_device(testing::choice_named<core::Device>(test_device()),
                               dist::rank_layout().local_rank);
}

std::shared_ptr<dist::Communicator> world() {
  core::DistributedConfig distributed;
  distributed.timeout_s = 120;
  return dist::make_communicator(distributed, device_of_rank());
}

// Two blocks of 5 slots, G = 2, vocab 13; the whole batch as 10 rows, segments (block, sample).
GspoPolicySamples whole_samples() {
  torch::manual_seed(31);
  const int64_t blocks = 2, slots = 5, group = 2, rows = blocks * slots;
  GspoPolicySamples s;
  s.targets = torch::randint(0, 13, {rows, group}, torch::kInt64);
  s.targets[4].fill_(-100);  // block 0's last slot is masked
  s.old_logprobs = -torch::rand({rows, group}) * 2 - 1;
  s.advantages = torch::randn({blocks, 1, group}).expand({blocks, slots, group}).reshape({rows, group});
  s.segments = torch::arange(blocks * group).view({blocks, 1, group}).expand({blocks, slots, group})
                   .reshape({rows, group});
  s.label_counts = torch::tensor({4, 5}).view({blocks, 1, 1}).expand({blocks, slots, group})
                       .reshape({rows, group});
  s.num_segments = blocks * group;
  return s;
}

// Rows [begin, end) with the seam order of those rows (segment-major inside the slice).
GspoPolicySamples slice_rows(const GspoPolicySamples& whole, int64_t begin, int64_t end,
                             const torch::Device& device) {
  GspoPolicySamples s = whole;
  for (auto* t : {&s.targets, &s.old_logprobs, &s.advantages, &s.segments, &s.label_counts}) {
    *t = t->slice(0, begin, end).contiguous().to(device);
  }
  auto flat = s.segments.reshape(-1).to(torch::kCPU);
  // Stable sort by segment id keeps each segment's tokens in slot order.
  s.seam_order = std::get<1>(flat.sort(/*stable=*/true, 0, false)).to(device);
  return s;
}

objectives::GspoSeamParams params_for(bool span) {
  objectives::GspoSeamParams p;
  p.logits_scale = 1.1;
  p.eps_low = 0.2;
  p.eps_high = 0.25;
  p.divisor = 4;
  p.segments_span_ranks = span;
  return p;
}

TEST(GspoDistributed, SegmentSplitOverRanksMatchesOneRank) {
  auto comm = world();
  ASSERT_EQ(comm->world_size(), 2);
  const auto device = device_of_rank();
  auto whole = whole_samples();
  torch::manual_seed(8);
  auto logits_cpu = torch::randn({10, 13});
  // Rank 0 holds rows 0..6, rank 1 rows 7..9: block 1 (rows 5..9) is split over the ranks.
  const int64_t begin = comm->rank() == 0 ? 0 : 7, end = comm->rank() == 0 ? 7 : 10;
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto local = dist::make_single_process_communicator();
    auto all = logits_cpu.to(device, dtype).clone().requires_grad_();
    auto whole_on_device = slice_rows(whole, 0, 10, device);
    auto expected = objectives::gspo_policy_loss(all, whole_on_device, params_for(false), *local);
    expected.loss.backward();

    auto mine = logits_cpu.slice(0, begin, end).to(device, dtype).clone().requires_grad_();
    auto split = objectives::gspo_policy_loss(mine, slice_rows(whole, begin, end, device),
                                              params_for(true), *comm);
    split.loss.backward();
    auto shares = torch::stack({split.seam.loss, split.seam.clipped_fraction,
                                split.seam.ratio_mean})
                      .to(torch::kCPU, torch::kFloat64)
                      .contiguous();
    comm->all_reduce(shares);
    const double tol = dtype == torch::kFloat32 ? 1e-5 : 2e-2;
    EXPECT_NEAR(shares[0].item<double>(), expected.seam.loss.item<double>(), tol);
    EXPECT_NEAR(shares[1].item<double>(), expected.seam.clipped_fraction.item<double>(), 1e-6);
    EXPECT_NEAR(shares[2].item<double>(), expected.seam.ratio_mean.item<double>(), tol);
    auto want = all.grad().slice(0, begin, end).to(torch::kCPU, torch::kFloat32);
    auto got = mine.grad().to(torch::kCPU, torch::kFloat32);
    EXPECT_TRUE(torch::allclose(got, want, 1e-3, dtype == torch::kFloat32 ? 1e-6 : 1e-3))
        << "rank " << comm->rank() << " max diff " << (got - want).abs().max().item<double>();
  }
}

// Row r's blocks of a rollout over a batch whose rows each hold `anchors` blocks.
objectives::GspoRollout rows_of(const objectives::GspoRollout& r, int64_t row, int64_t anchors) {
  auto owner = r.kept.div(anchors, "floor");
  auto pick = owner.eq(row).nonzero().squeeze(1);
  objectives::GspoRollout out = r;
  out.anchors = r.anchors.slice(0, row, row + 1);
  out.keep = r.keep.slice(0, row, row + 1);
  out.kept = r.kept.index_select(0, pick) - row * anchors;
  for (auto field : {&objectives::GspoRollout::tokens, &objectives::GspoRollout::choices,
                     &objectives::GspoRollout::old_logprobs, &objectives::GspoRollout::target_tokens,
                     &objectives::GspoRollout::supervised, &objectives::GspoRollout::accepted,
                     &objectives::GspoRollout::rewards, &objectives::GspoRollout::advantages,
                     &objectives::GspoRollout::candidates}) {
    if ((r.*field).defined()) out.*field = (r.*field).index_select(0, pick);
  }
  out.supervision_weight = 0;
  return out;
}

std::map<std::string, torch::Tensor> update_gradients(objectives::GspoObjective& objective,
                                                      const data::DraftBatch& batch,
                                                      objectives::GspoRollout rollout,
                                                      dist::Communicator& comm) {
  objectives::StepContext context;
  context.comm = &comm;
  context.seed = 5;
  objective.adopt_rollouts({std::move(rollout)}, context);
  objective.micro_step(batch, 0, context).loss.backward();
  objective.end_window(context);
  std::map<std::string, torch::Tensor> grads;
  for (auto& p : objective.module()->named_parameters()) {
    auto grad = p.value().grad().defined() ? p.value().grad().clone() : torch::zeros_like(p.value());
    comm.all_reduce(grad);
    grads[p.key()] = grad;
  }
  return grads;
}

std::unique_ptr<objectives::GspoObjective> tiny_policy(objectives::GspoSampling sampling) {
  auto config = testing::tiny_config();
  config.objective.name = "gspo";
  objectives::GspoSettings settings;
  settings.rollout.sampling = sampling;
  settings.rollout.reward = objectives::GspoReward::kExpectedAcceptance;
  settings.rollout.group_size = 3;
  settings.rollout.top_k = config.section<dspine::model::DSpineConfig>("model.dspine").top_k;
  torch::manual_seed(17);
  auto head = torch::randn({32, 16});
  auto embed = torch::randn({32, 16});
  auto objective = objectives::make_gspo_objective(
      testing::draft_config(config), testing::tiny_settings(), settings,
      config.training.accumulation_steps, embed, head, torch::kCPU, torch::kFloat32);
  objective->on_fresh_start("");
  return objective;
}

TEST(GspoDistributed, RanksUpdatingTheirRowsMatchTheConcatenatedBatch) {
  auto comm = dist::make_mpi_communicator(core::DistributedConfig{}.timeout_s);
  ASSERT_EQ(comm->world_size(), 2);
  // Both rows have the same 3 valid anchors (all fit num_anchors = 4): every split sees the same
  // blocks.
  const auto mask = testing::mask_rows({{0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0}});
  std::vector<data::DraftBatch> rows = {testing::random_batch(mask, 61),
                                        testing::random_batch(mask, 62)};
  const auto both = data::concat_rows(rows);
  for (auto sampling : {objectives::GspoSampling::kBackbone, objectives::GspoSampling::kRefinement}) {
    auto single = tiny_policy(sampling);
    auto local = dist::make_single_process_communicator();
    objectives::StepContext context;
    context.comm = local.get();
    context.seed = 5;
    single->begin_window({both}, context);
    // The rollout the single rank drew, split by rows for the two ranks.
    auto rollout = single->window_rollouts().at(0);
    single->end_window(context);
    auto expected = update_gradients(*single, both, rollout, *local);

    auto distributed = tiny_policy(sampling);
    auto grads = update_gradients(*distributed, rows[comm->rank()],
                                  rows_of(rollout, comm->rank(), 3), *comm);
    for (const auto& [name, grad] : expected) {
      EXPECT_TRUE(torch::allclose(grads.at(name), grad, 1e-4, 1e-6))
          << "sampling " << int(sampling) << " rank " << comm->rank() << " " << name
          << " max diff " << (grads.at(name) - grad).abs().max().item<double>();
    }
  }
}

}  // namespace
}  // namespace dspine
