// DSpine objective: blocks and weights, hand-computed terms, refinement gating, chunked
// checkpointing, the CE-only prepass, and the accumulation window with replay (docs/model.md;
// tests T10b–T13, T21–T24, T26–T28).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/draft_registry.h"
#include "objectives/chunking.h"
#include "objectives/dspine_blocks.h"
#include "objectives/dspine_forward.h"
#include "objectives/dspine_objective.h"
#include "objectives/dspine_schedule.h"
#include "objectives/dspine_terms.h"
#include "common/dspine_tiny.h"

namespace dspine::objectives {
namespace {

// A world of one that counts the collectives it is asked for.
using CountingCommunicator = dist::SingleProcessCommunicator;

using testing::draft_config;
using testing::mask_rows;
using testing::random_batch;
using testing::tiny_config;
using testing::tiny_model_config;
using testing::tiny_settings;
using testing::training_objective;

data::DraftBatch training_inputs() {
  return random_batch(
      mask_rows({{0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1}, {0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1}}), 7);
}

data::DraftBatch concat(const std::vector<data::DraftBatch>& parts) {
  std::vector<torch::Tensor> ids, mask, hidden, last;
  int64_t seq = 0;
  for (const auto& p : parts) seq = std::max(seq, p.input_ids.size(1));
  for (const auto& p : parts) {
    ids.push_back(p.input_ids);
    mask.push_back(p.loss_mask);
    hidden.push_back(p.hidden_states);
    last.push_back(p.target_last_hidden_states);
  }
  return {torch::cat(ids), torch::cat(mask), torch::cat(hidden), torch::cat(last)};
}

// The streams of a batch whose rows are global rows 0.. of step 0 under `seed`.
RowStreams row_streams(uint64_t seed) { return {seed, 0, 0}; }

StepContext context(dist::Communicator& comm, int64_t seed, int64_t step, int64_t total = 600) {
  StepContext ctx;
  ctx.step = step;
  ctx.total_steps = total;
  ctx.comm = &comm;
  ctx.seed = static_cast<uint64_t>(seed);
  ctx.training = true;
  return ctx;
}

std::map<std::string, torch::Tensor> take_grads(torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> grads;
  for (auto& p : module.named_parameters()) {
    grads[p.key()] = p.value().grad().defined() ? p.value().grad().clone() : torch::Tensor();
    p.value().mutable_grad() = torch::Tensor();
  }
  return grads;
}

void expect_grads_close(const std::map<std::string, torch::Tensor>& a,
                        const std::map<std::string, torch::Tensor>& b, double atol, double rtol) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, grad] : a) {
    ASSERT_TRUE(grad.defined()) << name;
    ASSERT_TRUE(b.at(name).defined()) << name;
    EXPECT_TRUE(torch::isfinite(grad).all().item<bool>()) << name;
    EXPECT_TRUE(torch::allclose(grad, b.at(name), rtol, atol))
        << name << " max diff " << (grad - b.at(name)).abs().max().item<double>();
  }
}

TEST(DSpineSchedule, EndpointsMatchTheSpec) {
  DSpineSettings c;
  auto at = [&](int64_t step) { return dspine_schedule(c, step, 600); };
  EXPECT_EQ(at(0).alignment_beta, 0.0);
  EXPECT_EQ(at(0).replacement_probability, 0.5);
  EXPECT_EQ(at(100).replacement_probability, 0.5);
  EXPECT_NEAR(at(150).replacement_probability, 0.25, 1e-12);
  EXPECT_EQ(at(200).replacement_probability, 0.0);
  EXPECT_EQ(at(146).alignment_beta, 0.5);
  EXPECT_NEAR(at(73).alignment_beta, 0.25, 1e-12);
  EXPECT_NEAR(at(125).replacement_probability, 0.375, 1e-12);
  EXPECT_EQ(dspine_schedule(c, 0, 0).replacement_probability, 0.0);
}

// config.json's dspine_config carries every reference key: the model's (the draft registry's
// dspine entry writes config.json) and the objective's.
TEST(DSpineObjective, HfConfigCarriesTheFullDSpineConfig) {
  auto settings = tiny_settings();
  settings.ce_weight = 0.25;
  const auto config = tiny_config();
  const auto draft = dspine::model::resolve_draft(config);
  dspine::model::HfConfigContext context;
  context.training_settings = dspine_settings_json(settings);
  const auto json = draft.entry->hf_config(config.model, *draft.settings, context)["dspine_config"];
  for (const char* key :
       {"transfer_rank", "message_size", "top_k", "ce_weight", "alignment_weight",
        "alignment_warmup_steps", "replacement_layers", "replacement_probability",
        "replacement_hold_ratio", "replacement_end_ratio", "candidate_mass_threshold"}) {
    EXPECT_TRUE(json.contains(key)) << key;
  }
  EXPECT_EQ(json.size(), 11u);
  EXPECT_EQ(json["ce_weight"], 0.25);
  EXPECT_EQ(json["top_k"], 3);
}

TEST(DSpineBlocks, AnchorsAndWeightsFollowTheWorkedExample) {
  auto batch = training_inputs();
  auto gen = row_streams(42);
  EXPECT_EQ(max_valid_anchors(batch.loss_mask), 8);
  auto sample = sample_anchors(batch.loss_mask, 4, gen);
  ASSERT_EQ(sample.anchors.sizes(), torch::IntArrayRef({2, 4}));
  EXPECT_TRUE(sample.keep.all().item<bool>());
  const std::vector<std::vector<int64_t>> valid = {{1, 2, 5, 6, 7, 8, 9, 10}, {2, 3, 4, 5, 6, 10}};
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t n = 0; n < 4; ++n) {
      const int64_t a = sample.anchors[b][n].item<int64_t>();
      EXPECT_NE(std::find(valid[b].begin(), valid[b].end(), a), valid[b].end()) << a;
      if (n > 0) EXPECT_LT(sample.anchors[b][n - 1].item<int64_t>(), a);
    }
  }
  auto anchors = torch::tensor({{2, 5}, {6, 10}}, torch::kInt64);
  auto layout = layout_blocks(batch.input_ids, batch.loss_mask, anchors,
                              torch::ones({2, 2}, torch::kBool), 4, 7.0);
  auto expected = torch::tensor(
      {{{1.0, 0.0, 0.0}, {1.0, 0.866878, 0.751477}}, {{1.0, 0.0, 0.0}, {1.0, 0.0, 0.0}}},
      torch::kFloat32);
  EXPECT_TRUE(torch::allclose(layout.weights, expected, 1e-6, 1e-6));
  EXPECT_EQ(layout.labels[1][1][1].item<int64_t>(), batch.input_ids[1][11].item<int64_t>());
  auto positions = block_position_ids(anchors, 12, 4);
  EXPECT_EQ(positions.sizes(), torch::IntArrayRef({2, 20}));
  EXPECT_EQ(positions[1][19].item<int64_t>(), 13);
}

// A block's supervised_slots cap its supervised proposals on top of the mask's own cut.
TEST(DSpineBlocks, SupervisedSlotsCapEachBlock) {
  auto batch = training_inputs();
  auto anchors = torch::tensor({{2, 5}, {6, 10}}, torch::kInt64);
  const auto keep = torch::ones({2, 2}, torch::kBool);
  auto capped = layout_blocks(batch.input_ids, batch.loss_mask, anchors, keep, 4, 7.0,
                              torch::tensor({{3, 2}, {1, 3}}, torch::kInt64));
  auto free = layout_blocks(batch.input_ids, batch.loss_mask, anchors, keep, 4, 7.0);
  // Row 0 block 1 keeps 2 of its 3 supervised proposals; the other blocks were already cut by
  // the mask at or before their limit.
  auto expected = free.weights.clone();
  expected[0][1][2] = 0.0;
  EXPECT_TRUE(torch::equal(capped.weights, expected));
  EXPECT_TRUE(torch::equal(capped.labels, free.labels));
  EXPECT_EQ(capped.supervised.sum().item<int64_t>(), free.supervised.sum().item<int64_t>() - 1);
}

TEST(DSpineObjectiveTerms, MaskGapGivesTheHandComputedDenominatorAndIgnoresLaterTeachers) {
  auto config = tiny_config();
  auto objective = training_objective(config, tiny_settings());
  auto batch = random_batch(mask_rows({{0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1}}), 3);
  BlockOverrides overrides;
  overrides.anchors = torch::tensor({{1}}, torch::kInt64);
  CountingCommunicator comm;
  DSpineForwardOptions options;
  options.step = 300;
  options.total_steps = 600;
  options.comm = &comm;
  options.overrides = &overrides;
  auto gen = row_streams(1);
  auto& model = objective->training_model();
  auto out = model.forward(batch, gen, options);
  EXPECT_NEAR(out.denominator.item<double>(), 1.0 + std::exp(-1.0 / 7.0), 1e-6);
  EXPECT_NEAR(out.denominator.item<double>(), 1.866878, 1e-6);

  auto shifted = batch;
  shifted.target_last_hidden_states = batch.target_last_hidden_states.clone();
  shifted.target_last_hidden_states.slice(1, 3) += 100.0;
  auto again = model.forward(shifted, gen, options);
  EXPECT_TRUE(torch::equal(again.loss, out.loss));
}

TEST(DSpineObjectiveTerms, RefinementIsZeroWhenTheLabelIsOutsideTheCandidates) {
  auto config = tiny_config();
  auto objective = training_objective(config, tiny_settings());
  auto head = torch::zeros({32, 16});
  head.select(1, 0).copy_(torch::arange(32, torch::kFloat32));
  torch::manual_seed(4);
  const int64_t blocks = 2, proposals = 3;
  auto hidden = torch::zeros({blocks, proposals, 16});
  hidden.select(2, 0).fill_(10.0);
  std::vector<at::Tensor> chunk(kFullTermInputs);
  chunk[kHidden] = hidden;
  chunk[kPre] = torch::randn({blocks, proposals, 16});
  chunk[kFeatures] = torch::randn({blocks, 3, proposals, 8});
  chunk[kLabels] = torch::zeros({blocks, proposals}, torch::kInt64);
  chunk[kPredecessors] = torch::zeros({blocks, proposals}, torch::kInt64);
  chunk[kTeacherHidden] = -hidden;
  chunk[kWeights] = torch::ones({blocks, proposals});
  chunk[kSupervised] = torch::ones({blocks, proposals}, torch::kBool);
  auto terms =
      objective_terms(*objective->draft(), head, tiny_settings(),
                      config.section<dspine::model::DSpineConfig>("model.dspine").top_k, chunk);
  EXPECT_EQ(terms[kRefine].item<double>(), 0.0);
  EXPECT_EQ(terms[kCoverage].item<double>(), 0.0);
  EXPECT_EQ(terms[kCorrect].item<double>(), 0.0);
  for (const auto& t : terms) EXPECT_TRUE(std::isfinite(t.item<double>()));
}

TEST(DSpineObjectiveTerms, SmallCaseMatchesHandComputedTerms) {
  // One block, one proposal, V = 32: every term recomputed here from its definition.
  auto config = tiny_config();
  auto objective = training_objective(config, tiny_settings());
  auto& draft = *objective->draft();
  const auto& head = objective->training_model().lm_head();
  torch::manual_seed(8);
  std::vector<at::Tensor> chunk(kFullTermInputs);
  chunk[kHidden] = torch::randn({1, 1, 16});
  chunk[kPre] = torch::randn({1, 1, 16});
  chunk[kFeatures] = torch::randn({1, 3, 1, 8});
  chunk[kLabels] = torch::tensor({{5}}, torch::kInt64);
  chunk[kPredecessors] = torch::tensor({{9}}, torch::kInt64);
  chunk[kTeacherHidden] = torch::randn({1, 1, 16});
  chunk[kWeights] = torch::tensor({{0.75f}});
  chunk[kSupervised] = torch::ones({1, 1}, torch::kBool);
  torch::NoGradGuard no_grad;
  auto terms =
      objective_terms(draft, head, tiny_settings(),
                      config.section<dspine::model::DSpineConfig>("model.dspine").top_k, chunk);

  auto z = head.matmul(chunk[kHidden].view({16}));
  auto p = torch::softmax(z, 0);
  auto q = torch::softmax(head.matmul(chunk[kTeacherHidden].view({16})), 0);
  const double w = 0.75, cw = 0.1;
  EXPECT_NEAR(terms[kCe].item<double>(), -w * std::log(p[5].item<double>()), 1e-5);
  EXPECT_NEAR(terms[kL1].item<double>(), w * (p - q).abs().sum().item<double>(), 1e-5);
  auto cand = std::get<1>(z.topk(3));
  auto rho = draft.refine(chunk[kPre].view({16}), torch::tensor(9, torch::kInt64));
  auto lam = torch::log_softmax(head.index_select(0, cand).matmul(rho), 0);
  auto qc = q.index_select(0, cand);
  auto mass = qc.sum().item<double>();
  double rce = 0;
  for (int64_t i = 0; i < 3; ++i) {
    if (cand[i].item<int64_t>() == 5) rce = -lam[i].item<double>();
  }
  const double rl1 = mass > 1e-4 ? (lam.exp() - qc / mass).abs().sum().item<double>() : 0.0;
  EXPECT_NEAR(terms[kRefine].item<double>(), w * (cw * rce + (1 - cw) * rl1), 1e-5);
  auto code = draft.transfer_codes[5];
  double align = 0;
  for (int64_t l = 0; l < 3; ++l) {
    auto f = chunk[kFeatures][0][l][0];
    align += 1 - (f.dot(code) / (f.norm() * code.norm())).item<double>();
  }
  EXPECT_NEAR(terms[kAlign].item<double>(), w * align, 1e-5);
}

TEST(DSpineObjectiveTerms, DroppedBlocksContributeNothing) {
  auto config = tiny_config();
  auto objective = training_objective(config, tiny_settings());
  auto batch = random_batch(mask_rows({{0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}}), 5);
  CountingCommunicator comm;
  auto evaluate = [&](const BlockOverrides& overrides) {
    DSpineForwardOptions options;
    options.step = 300;
    options.total_steps = 600;
    options.comm = &comm;
    options.overrides = &overrides;
    auto gen = row_streams(1);
    auto out = objective->training_model().forward(batch, gen, options);
    out.loss.backward();
    return std::make_pair(out.loss.detach(), take_grads(*objective->draft()));
  };
  BlockOverrides one{torch::tensor({{2}}, torch::kInt64), {}, {}};
  BlockOverrides with_dropped{
      torch::tensor({{2, 6}}, torch::kInt64), torch::tensor({{true, false}}), {}};
  auto [loss_one, grads_one] = evaluate(one);
  auto [loss_dropped, grads_dropped] = evaluate(with_dropped);
  EXPECT_TRUE(torch::allclose(loss_one, loss_dropped, 1e-6, 1e-6));
  expect_grads_close(grads_one, grads_dropped, 1e-6, 1e-5);
}

struct ForwardResult {
  torch::Tensor loss;
  std::map<std::string, torch::Tensor> grads;
};

ForwardResult chunked_forward(int64_t chunk_blocks, bool inspect_graph = false,
                              std::vector<std::string>* node_names = nullptr) {
  auto objective = training_objective(tiny_config(), tiny_settings(chunk_blocks));
  auto batch = training_inputs();
  CountingCommunicator comm;
  DSpineForwardOptions options;
  options.step = 100;
  options.total_steps = 600;
  options.comm = &comm;
  auto gen = row_streams(42);
  auto out = objective->training_model().forward(batch, gen, options);
  EXPECT_TRUE(out.replace.defined());  // replacement is active at step 100
  if (inspect_graph && node_names != nullptr) {
    std::vector<torch::autograd::Node*> stack = {out.loss.grad_fn().get()};
    std::set<torch::autograd::Node*> seen;
    while (!stack.empty()) {
      auto* node = stack.back();
      stack.pop_back();
      if (node == nullptr || !seen.insert(node).second) continue;
      node_names->push_back(node->name());
      for (const auto& edge : node->next_edges()) stack.push_back(edge.function.get());
    }
  }
  out.loss.backward();
  auto& model = objective->training_model();
  EXPECT_FALSE(model.lm_head().grad().defined());
  EXPECT_FALSE(model.embed_tokens().grad().defined());
  EXPECT_FALSE(objective->draft()->transfer_codes.grad().defined());
  return {out.loss.detach(), take_grads(*objective->draft())};
}

TEST(DSpineChunking, ChunkedObjectiveEqualsUnchunkedLossAndGradients) {
  auto whole = chunked_forward(0);
  for (int64_t chunk : {1, 3}) {
    auto chunked = chunked_forward(chunk);
    EXPECT_TRUE(torch::allclose(chunked.loss, whole.loss, 1.3e-6, 1e-5)) << chunk;
    expect_grads_close(chunked.grads, whole.grads, 2e-5, 2e-4);
  }
}

TEST(DSpineChunking, CheckpointedChunksKeepNoVocabularySizedActivations) {
  auto contains = [](const std::vector<std::string>& names, const std::string& what) {
    for (const auto& n : names) {
      if (n.find(what) != std::string::npos) return true;
    }
    return false;
  };
  std::vector<std::string> plain, checkpointed;
  chunked_forward(0, true, &plain);
  chunked_forward(3, true, &checkpointed);
  // Unchunked, the graph holds the log-softmax/|p − q| nodes that save [M, T, V] tensors.
  EXPECT_TRUE(contains(plain, "LogSoftmaxBackward"));
  EXPECT_TRUE(contains(plain, "AbsBackward"));
  EXPECT_FALSE(contains(plain, kChunkCheckpointNodeName));
  // Checkpointed, only the checkpoint nodes (which save their chunk inputs) remain.
  EXPECT_TRUE(contains(checkpointed, kChunkCheckpointNodeName));
  EXPECT_FALSE(contains(checkpointed, "LogSoftmaxBackward"));
  EXPECT_FALSE(contains(checkpointed, "AbsBackward"));
  EXPECT_FALSE(contains(checkpointed, "TopkBackward"));
}

TEST(DSpineChunking, RejectsMisalignedInputs) {
  auto fn = [](const std::vector<at::Tensor>& c) { return std::vector<at::Tensor>{c[0].sum()}; };
  EXPECT_THROW(checkpointed_chunk_reduce(fn, {torch::ones({3}), torch::ones({2})}, 1, {}), Error);
  EXPECT_THROW(checkpointed_chunk_reduce(fn, {}, 1, {}), Error);
  EXPECT_THROW(checkpointed_chunk_reduce(fn, {torch::ones({0})}, 1, {}), Error);
}

TEST(DSpinePrepass, CeOnlyEqualsTheFullPassCeWithoutTeacherRefinementOrCollective) {
  for (int64_t step : {100, 300}) {
    auto objective = training_objective(tiny_config(), tiny_settings(3));
    auto& model = objective->training_model();
    auto batch = training_inputs();
    CountingCommunicator comm;
    torch::NoGradGuard no_grad;
    DSpineForwardOptions options;
    options.step = step;
    options.total_steps = 600;
    options.comm = &comm;
    auto gen_full = row_streams(39);
    auto full = model.forward(batch, gen_full, options);
    EXPECT_EQ(comm.collective_count(), 1);

    // The prepass never touches the teacher: poisoned teacher states leave it finite.
    auto poisoned = batch;
    poisoned.target_last_hidden_states = torch::full_like(batch.target_last_hidden_states, NAN);
    options.ce_only = true;
    auto gen_ce = row_streams(39);
    auto ce = model.forward(poisoned, gen_ce, options);
    EXPECT_EQ(comm.collective_count(), 1) << "the prepass must issue no collective";
    EXPECT_TRUE(torch::allclose(ce.ce, full.ce, 1.3e-6, 1e-5));
    EXPECT_TRUE(torch::equal(ce.denominator, full.denominator));
    EXPECT_TRUE(torch::equal(ce.correct, full.correct));
    EXPECT_TRUE(torch::equal(ce.count, full.count));
    EXPECT_FALSE(ce.l1.defined());
    EXPECT_FALSE(ce.refinement.defined());
    EXPECT_FALSE(ce.alignment.defined());
    EXPECT_FALSE(ce.coverage.defined());
  }
}

TEST(DSpinePrepass, CeOnlyWithAutogradIsRejected) {
  auto objective = training_objective(tiny_config(), tiny_settings());
  DSpineForwardOptions options;
  options.ce_only = true;
  auto gen = row_streams(1);
  try {
    objective->training_model().forward(training_inputs(), gen, options);
    FAIL() << "ce_only with autograd must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gradients to be disabled"), std::string::npos);
  }
}

// Runs one optimizer window through the Objective interface; returns the window metrics.
std::map<std::string, double> run_window(DSpineObjective& objective,
                                         const std::vector<data::DraftBatch>& batches,
                                         StepContext& ctx) {
  objective.begin_window(batches, ctx);
  for (size_t i = 0; i < batches.size(); ++i) {
    auto result = objective.micro_step(batches[i], static_cast<int64_t>(i), ctx);
    result.loss.backward();
  }
  return objective.end_window(ctx);
}

TEST(DSpineWindow, CeScaleAndDenominatorAreReducedOncePerWindow) {
  for (int64_t a : {2, 4}) {
    auto objective = training_objective(tiny_config(a), tiny_settings());
    CountingCommunicator comm;
    auto ctx = context(comm, 5, 100);
    std::vector<data::DraftBatch> batches;
    for (int64_t i = 0; i < a; ++i)
      batches.push_back(random_batch(training_inputs().loss_mask, 20 + i));
    objective->begin_window(batches, ctx);
    EXPECT_EQ(comm.collective_count(), 1) << "A = " << a;
    for (int64_t i = 0; i < a; ++i) objective->micro_step(batches[i], i, ctx).loss.backward();
    EXPECT_EQ(comm.collective_count(), 1) << "replays must not reduce again";
    objective->end_window(ctx);
    EXPECT_EQ(comm.collective_count(), 2) << "end_window reduces the metrics once";
  }
}

TEST(DSpineWindow, WindowGradientsEqualOneConcatenatedBatch) {
  // Uneven masks whose valid anchors all fit (num_anchors = 4), so every run sees the same blocks.
  const auto sparse = mask_rows({{0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}});
  const auto dense = mask_rows({{0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0}});
  for (int64_t a : {2, 4}) {
    for (int64_t step : {300, 301}) {
      std::vector<data::DraftBatch> micro;
      for (int64_t i = 0; i < a; ++i) micro.push_back(random_batch(i % 2 ? dense : sparse, 40 + i));

      auto windowed = training_objective(tiny_config(a), tiny_settings());
      CountingCommunicator comm_w;
      auto ctx_w = context(comm_w, 11, step);
      auto metrics_w = run_window(*windowed, micro, ctx_w);
      auto grads_w = take_grads(*windowed->draft());

      auto combined = training_objective(tiny_config(1), tiny_settings());
      CountingCommunicator comm_c;
      auto ctx_c = context(comm_c, 11, step);
      auto metrics_c = run_window(*combined, {concat(micro)}, ctx_c);
      auto grads_c = take_grads(*combined->draft());

      EXPECT_NEAR(metrics_w.at("loss"), metrics_c.at("loss"),
                  2e-6 * std::abs(metrics_c.at("loss")));
      EXPECT_NEAR(metrics_w.at("dspine/denominator"), metrics_c.at("dspine/denominator"), 1e-5);
      expect_grads_close(grads_w, grads_c, 2e-5, 2e-4);
    }
  }
  // Worked example: D = 1 (sparse row) + 2.618355 + 1.866878 + 1 (dense row anchors 1, 2, 3).
  auto objective = training_objective(tiny_config(2), tiny_settings());
  CountingCommunicator comm;
  auto ctx = context(comm, 11, 300);
  auto metrics = run_window(*objective, {random_batch(sparse, 1), random_batch(dense, 2)}, ctx);
  EXPECT_NEAR(metrics.at("dspine/denominator"), 1 + 2.618355 + 1.866878 + 1, 1e-5);
}

TEST(DSpineWindow, ReplayReproducesAnchorsAndReplacement) {
  auto objective = training_objective(tiny_config(2), tiny_settings());
  std::vector<DSpineOutput> seen;
  std::vector<bool> grad_enabled;
  objective->set_forward_observer([&](const DSpineOutput& out) {
    seen.push_back(out);
    grad_enabled.push_back(torch::GradMode::is_enabled());
  });
  CountingCommunicator comm;
  auto ctx = context(comm, 321, 100);
  std::vector<data::DraftBatch> batches = {training_inputs(),
                                           random_batch(training_inputs().loss_mask, 9)};
  run_window(*objective, batches, ctx);
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(grad_enabled, std::vector<bool>({false, false, true, true}));
  for (int i = 0; i < 2; ++i) {
    const auto& prepass = seen[i];
    const auto& replay = seen[i + 2];
    EXPECT_TRUE(torch::equal(prepass.blocks.anchors, replay.blocks.anchors));
    EXPECT_TRUE(torch::equal(prepass.blocks.keep, replay.blocks.keep));
    EXPECT_TRUE(torch::equal(prepass.position_ids, replay.position_ids));
    ASSERT_TRUE(prepass.replace.defined());
    EXPECT_TRUE(torch::equal(prepass.replace, replay.replace));
  }
  EXPECT_FALSE(torch::equal(seen[0].blocks.anchors, seen[1].blocks.anchors));

  // Both are the draws of plain forwards on the micro-batches' row streams: rows 0-1 and 2-3 of
  // step 100.
  torch::NoGradGuard no_grad;
  DSpineForwardOptions options;
  options.step = 100;
  options.total_steps = 600;
  options.ce_only = true;
  for (int64_t i = 0; i < 2; ++i) {
    const RowStreams streams{321, 100, 2 * i};
    auto plain = objective->training_model().forward(batches[i], streams, options);
    EXPECT_TRUE(torch::equal(plain.blocks.anchors, seen[i].blocks.anchors)) << i;
    EXPECT_TRUE(torch::equal(plain.replace, seen[i].replace)) << i;
  }
}

// A row's anchors and replacement mask are its own stream's, whatever rows share its batch, and
// the streams differ by row, step and seed.
TEST(DSpineBlocks, RowsDrawTheSameBlocksInAnyGrouping) {
  auto objective = training_objective(tiny_config(), tiny_settings());
  auto& model = objective->training_model();
  auto batch = training_inputs();
  DSpineForwardOptions options;
  options.step = 100;  // replacement probability 0.5
  options.total_steps = 600;
  const RowStreams streams{5, 100, 10};
  auto both = model.sample_blocks(batch, streams, options);
  ASSERT_TRUE(both.replace.defined());
  for (int64_t row = 0; row < 2; ++row) {
    auto alone = model.sample_blocks(
        data::DraftBatch{batch.input_ids.narrow(0, row, 1), batch.loss_mask.narrow(0, row, 1),
                         batch.hidden_states.narrow(0, row, 1),
                         batch.target_last_hidden_states.narrow(0, row, 1)},
        streams.rows_from(row), options);
    const int64_t width = alone.blocks.anchors.size(1);
    auto keep = both.blocks.keep[row];
    EXPECT_EQ(keep.narrow(0, width, keep.size(0) - width).any().item<bool>(), false) << row;
    EXPECT_TRUE(torch::equal(alone.blocks.keep[0], keep.narrow(0, 0, width))) << row;
    EXPECT_TRUE(torch::equal(alone.blocks.anchors[0],
                             both.blocks.anchors[row].narrow(0, 0, width))) << row;
    EXPECT_TRUE(torch::equal(alone.replace[0], both.replace[row].narrow(0, 0, width))) << row;
  }
  for (const RowStreams other : {RowStreams{5, 101, 10}, RowStreams{6, 100, 10},
                                 RowStreams{5, 100, 12}}) {
    auto sample = sample_anchors(batch.loss_mask, 4, other);
    EXPECT_FALSE(torch::equal(sample.anchors, both.blocks.anchors));
  }
}

objectives::DSpineSettings skip_first_settings() {
  auto settings = tiny_settings();
  settings.prepass = DSpinePrepass::kSkipFirst;
  return settings;
}

// prepass: skip_first is the same window with one CE-only forward fewer: the same loss, metrics
// and gradients (the same anchors and replacement draws), and one reduction, made by the first
// replay.
TEST(DSpineWindow, SkippingTheFirstPrepassGivesTheSameWindow) {
  for (int64_t a : {2, 4}) {
    std::vector<data::DraftBatch> micro;
    for (int64_t i = 0; i < a; ++i) {
      micro.push_back(random_batch(training_inputs().loss_mask, 60 + i));
    }
    auto every = training_objective(tiny_config(a), tiny_settings());
    CountingCommunicator comm_every;
    auto ctx_every = context(comm_every, 17, 100);
    auto metrics_every = run_window(*every, micro, ctx_every);
    auto grads_every = take_grads(*every->draft());

    auto skipping = training_objective(tiny_config(a), skip_first_settings());
    std::vector<bool> grad_enabled;
    skipping->set_forward_observer(
        [&](const DSpineOutput&) { grad_enabled.push_back(torch::GradMode::is_enabled()); });
    CountingCommunicator comm;
    auto ctx = context(comm, 17, 100);
    skipping->begin_window(micro, ctx);
    EXPECT_EQ(comm.collective_count(), 0) << "A = " << a << ": the first replay reduces";
    for (int64_t i = 0; i < a; ++i) {
      skipping->micro_step(micro[i], i, ctx).loss.backward();
      EXPECT_EQ(comm.collective_count(), 1) << "A = " << a << ", after replay " << i;
    }
    auto metrics = skipping->end_window(ctx);
    auto grads = take_grads(*skipping->draft());

    std::vector<bool> expected(a - 1, false);  // prepasses of micro-batches 1..A-1
    expected.resize(2 * a - 1, true);          // then A replays
    EXPECT_EQ(grad_enabled, expected);
    ASSERT_EQ(metrics.size(), metrics_every.size());
    for (const auto& [key, value] : metrics_every) {
      EXPECT_NEAR(metrics.at(key), value, 1e-6 * std::max(1.0, std::abs(value))) << key;
    }
    expect_grads_close(grads, grads_every, 1e-7, 1e-6);
  }
}

TEST(DSpineWindow, SkippedFirstPrepassIsReplayedFirst) {
  auto objective = training_objective(tiny_config(2), skip_first_settings());
  CountingCommunicator comm;
  auto ctx = context(comm, 3, 300);
  auto batch = training_inputs();
  objective->begin_window({batch, batch}, ctx);
  try {
    objective->micro_step(batch, 1, ctx);
    FAIL() << "replaying micro-batch 1 before the deferred micro-batch 0 must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("before the window's reduction"), std::string::npos)
        << e.what();
  }
  objective->micro_step(batch, 0, ctx).loss.backward();
  objective->micro_step(batch, 1, ctx).loss.backward();
  EXPECT_TRUE(std::isfinite(objective->end_window(ctx).at("loss")));
}

// Counts the draft's forwards: each one announces its context unit once.
class ForwardCounter final : public model::UnitObserver {
 public:
  void before_unit(const std::string& unit) override { forwards += unit == "context"; }
  at::Tensor after_unit(const std::string&, const at::Tensor& output) override { return output; }
  int forwards = 0;
};

// prepass: keep_last is the same window as every other scheme, on the reference and the fused
// vocabulary path: the last micro-batch's prepass runs with autograd and its replay continues
// from it, so the draft runs A − 1 + (A − 1) times instead of skip_first's A − 1 + A.
TEST(DSpineWindow, KeepingTheLastPrepassGivesTheSameWindow) {
  auto keep_last = tiny_settings();
  keep_last.prepass = DSpinePrepass::kKeepLast;
  for (bool fused : {false, true}) {
    for (int64_t a : {2, 3}) {
      std::vector<data::DraftBatch> micro;
      for (int64_t i = 0; i < a; ++i) {
        micro.push_back(random_batch(training_inputs().loss_mask, 80 + i));
      }
      auto every = training_objective(tiny_config(a), tiny_settings());
      every->training_model().use_fused_vocabulary(fused);
      CountingCommunicator comm_every;
      auto ctx_every = context(comm_every, 19, 100);
      const auto metrics_every = run_window(*every, micro, ctx_every);
      const auto grads_every = take_grads(*every->draft());

      auto keeping = training_objective(tiny_config(a), keep_last);
      keeping->training_model().use_fused_vocabulary(fused);
      auto counter = std::make_shared<ForwardCounter>();
      keeping->draft()->set_unit_observer(counter);
      std::vector<bool> grad_enabled;
      keeping->set_forward_observer(
          [&](const DSpineOutput&) { grad_enabled.push_back(torch::GradMode::is_enabled()); });
      CountingCommunicator comm;
      auto ctx = context(comm, 19, 100);
      const auto metrics = run_window(*keeping, micro, ctx);
      const auto grads = take_grads(*keeping->draft());

      const std::string where =
          std::string(fused ? "fused" : "reference") + ", A = " + std::to_string(a);
      std::vector<bool> expected(a - 2, false);  // CE-only prepasses of micro-batches 1..A-2
      expected.resize(2 * a - 1, true);          // the kept prepass, then A replays
      EXPECT_EQ(grad_enabled, expected) << where;
      EXPECT_EQ(counter->forwards, 2 * a - 2) << where;
      ASSERT_EQ(metrics.size(), metrics_every.size());
      for (const auto& [key, value] : metrics_every) {
        EXPECT_NEAR(metrics.at(key), value, 1e-6 * std::max(1.0, std::abs(value)))
            << where << " " << key;
      }
      expect_grads_close(grads, grads_every, 1e-7, 1e-6);
    }
  }
}

TEST(DSpineWindow, EvaluationNeverReplays) {
  auto objective = training_objective(tiny_config(2), tiny_settings());
  int forwards = 0;
  objective->set_forward_observer([&](const DSpineOutput& out) {
    ++forwards;
    EXPECT_FALSE(torch::GradMode::is_enabled());
    EXPECT_FALSE(out.replace.defined());
  });
  CountingCommunicator comm;
  auto ctx = context(comm, 3, 100);
  ctx.training = false;
  auto metrics = objective->evaluate(training_inputs(), ctx);
  EXPECT_EQ(forwards, 1);
  EXPECT_TRUE(std::isfinite(metrics.at("loss")));
  EXPECT_GT(metrics.at("loss"), 0.0);
}

TEST(DSpineWindow, IncompleteWindowsAndMixedLossesAreErrors) {
  auto objective = training_objective(tiny_config(2), tiny_settings());
  CountingCommunicator comm;
  auto ctx = context(comm, 3, 300);
  auto batch = training_inputs();
  try {
    objective->begin_window({batch}, ctx);
    FAIL() << "a one-batch window with A = 2 must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("incomplete gradient accumulation: received 1 of 2"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(objective->micro_step(batch, 0, ctx), Error);

  objective->begin_window({batch, batch}, ctx);
  objective->micro_step(batch, 0, ctx).loss.backward();
  // An immediate (evaluation) loss while replays are pending mixes the two kinds of losses.
  try {
    objective->evaluate(batch, ctx);
    FAIL() << "evaluation inside a pending window must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Cannot mix immediate and replayed losses"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(objective->end_window(ctx), Error);  // one replay still pending
  EXPECT_THROW(objective->begin_window({batch, batch}, ctx), Error);

  auto fresh = training_objective(tiny_config(2), tiny_settings());
  auto other = random_batch(
      mask_rows({{0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0}}), 77);
  fresh->begin_window({batch, batch}, ctx);
  EXPECT_THROW(fresh->micro_step(batch, 1, ctx), Error);  // out of order
  EXPECT_THROW(fresh->micro_step(other, 0, ctx), Error);  // not the batch that was prepassed
}

std::vector<torch::Device> devices() {
  std::vector<torch::Device> out = {torch::kCPU};
  if (torch::cuda::is_available()) out.emplace_back(torch::kCUDA);
  return out;
}

TEST(DSpineObjective, Bf16DraftKeepsFp32CodesAndTrainsWithFiniteGradients) {
  for (const auto& device : devices()) {
    for (int64_t step : {100, 300}) {
      SCOPED_TRACE(device.str());
      auto config = tiny_config(2);
      config.training.dtype = dspine::core::Dtype::kBf16;
      torch::manual_seed(17);
      auto head = torch::randn({32, 16});
      auto embed = torch::randn({32, 16});
      auto objective = make_dspine_objective(draft_config(config), tiny_settings(3),
                                             config.training.accumulation_steps, embed, head,
                                             device, torch::kBFloat16);
      objective->on_fresh_start("");
      auto draft = objective->draft();
      EXPECT_EQ(draft->fc->weight.scalar_type(), torch::kBFloat16);
      EXPECT_EQ(draft->transfer_codes.scalar_type(), torch::kFloat32);
      EXPECT_EQ(draft->transfer_ready_flag.scalar_type(), torch::kBool);
      EXPECT_TRUE(
          torch::allclose(draft->transfer_codes.norm(2, -1).cpu(), torch::ones({32}), 1e-5, 1e-5));
      CountingCommunicator comm;
      auto ctx = context(comm, 9, step);
      auto metrics = run_window(
          *objective, {training_inputs(), random_batch(training_inputs().loss_mask, 4)}, ctx);
      EXPECT_TRUE(std::isfinite(metrics.at("loss")));
      for (const auto& [name, grad] : take_grads(*draft)) {
        ASSERT_TRUE(grad.defined()) << name;
        EXPECT_TRUE(torch::isfinite(grad).all().item<bool>()) << name;
      }
      EXPECT_FALSE(draft->transfer_codes.grad().defined());
      EXPECT_EQ(draft->transfer_codes.scalar_type(), torch::kFloat32);
    }
  }
}

// A training window's values stay where they were computed and are read once, by end_window
// (docs/model.md, "The host stays ahead"): on the GPU a replay given another batch than its
// prepass is named by end_window, on the CPU (where reading costs nothing) by its micro_step.
// Either way the error comes before the optimizer step, and the window's losses are those of the
// host's arithmetic.
TEST(DSpineWindow, AReplayOfAnotherBatchIsNamedByTheWindowsEnd) {
  const auto other = random_batch(
      mask_rows({{0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0}}), 77);
  for (const auto& device : devices()) {
    for (auto prepass : {DSpinePrepass::kAll, DSpinePrepass::kSkipFirst}) {
      SCOPED_TRACE(device.str() + (prepass == DSpinePrepass::kAll ? " all" : " skip_first"));
      auto settings = tiny_settings();
      settings.prepass = prepass;
      torch::manual_seed(17);
      auto objective = make_dspine_objective(tiny_model_config(), settings, /*accumulation=*/2,
                                             torch::randn({32, 16}), torch::randn({32, 16}), device,
                                             torch::kFloat32);
      objective->on_fresh_start("");
      CountingCommunicator comm;
      auto ctx = context(comm, 3, 300);
      const auto batch = training_inputs();
      objective->begin_window({batch, batch}, ctx);
      objective->micro_step(batch, 0, ctx).loss.backward();
      try {
        objective->micro_step(other, 1, ctx).loss.backward();
        EXPECT_TRUE(device.is_cuda()) << "on the CPU the replay's own micro_step names it";
        objective->end_window(ctx);
        FAIL() << "a replay of another batch must fail by end_window";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("drew different blocks than its prepass"),
                  std::string::npos)
            << e.what();
      }
    }
  }
}

// Anchors and replacements are drawn on the host (docs/model.md, "The host stays ahead"): a batch
// moved to the GPU keeps its mask's host copy and draws from it, a batch made on the GPU without
// one reads its mask, and either way the blocks are those drawn for the batch on the CPU.
TEST(DSpineBlocks, EveryDeviceDrawsTheBlocksOfTheHost) {
  const auto batch = training_inputs();
  DSpineForwardOptions options;
  options.step = 100;  // replacement probability 0.5
  options.total_steps = 600;
  const RowStreams streams{5, 100, 10};
  std::optional<DraftPass> on_cpu;
  for (const auto& device : devices()) {
    SCOPED_TRACE(device.str());
    torch::manual_seed(17);
    auto objective = make_dspine_objective(tiny_model_config(), tiny_settings(),
                                           /*accumulation=*/1, torch::randn({32, 16}),
                                           torch::randn({32, 16}), device, torch::kFloat32);
    const auto moved = batch.to(device);
    EXPECT_EQ(moved.host_loss_mask.defined(), device.is_cuda());
    EXPECT_TRUE(torch::equal(moved.loss_mask_on_host(), batch.loss_mask));
    auto made_there = moved;
    made_there.host_loss_mask = at::Tensor();
    for (const auto& input : {moved, made_there}) {
      auto pass = objective->training_model().sample_blocks(input, streams, options);
      ASSERT_TRUE(pass.replace.defined());
      EXPECT_EQ(pass.blocks.anchors.device().type(), device.type());
      EXPECT_EQ(pass.replace.device().type(), device.type());
      if (!on_cpu) on_cpu = pass;
      EXPECT_TRUE(torch::equal(pass.blocks.anchors.cpu(), on_cpu->blocks.anchors));
      EXPECT_TRUE(torch::equal(pass.blocks.keep.cpu(), on_cpu->blocks.keep));
      EXPECT_TRUE(torch::equal(pass.replace.cpu(), on_cpu->replace));
      EXPECT_TRUE(torch::equal(pass.blocks.labels.cpu(), on_cpu->blocks.labels));
    }
  }
}

}  // namespace
}  // namespace dspine::objectives
