// Acceptance figures on hand-built blocks (τ when all are accepted, on a first-slot miss, at the
// end of a sequence; acceptance by position), and the evaluator on a tiny draft with verifiers
// whose answers are known: one that accepts every drafted token and one that accepts none.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/dspine_tiny.h"
#include "dist/communicator.h"
#include "objectives/acceptance.h"

namespace dspine::objectives {
namespace {

using testing::mask_rows;
using testing::random_batch;
using testing::tiny_config;
using testing::tiny_settings;

std::vector<int64_t> histogram_of(const torch::Tensor& tokens, const torch::Tensor& labels,
                                  const torch::Tensor& supervised) {
  auto h = accepted_histogram(tokens, labels, supervised).contiguous();
  return {h.data_ptr<int64_t>(), h.data_ptr<int64_t>() + h.numel()};
}

// block_size 5: T = 4 proposals per block, labels 5 6 7 8.
torch::Tensor labels() { return torch::tensor({{5, 6, 7, 8}}, torch::kInt64); }
torch::Tensor all_real() { return torch::ones({1, 4}, torch::kBool); }

TEST(AcceptedLength, AllAcceptedIsBlockSize) {
  auto h = histogram_of(labels(), labels(), all_real());
  EXPECT_EQ(h, (std::vector<int64_t>{0, 0, 0, 0, 1}));
  EXPECT_DOUBLE_EQ(mean_accepted_length(h), 5.0);  // T accepted + the target's own token
}

TEST(AcceptedLength, FirstSlotMissIsOne) {
  auto tokens = torch::tensor({{4, 6, 7, 8}}, torch::kInt64);  // later slots match, too late
  auto h = histogram_of(tokens, labels(), all_real());
  EXPECT_EQ(h, (std::vector<int64_t>{1, 0, 0, 0, 0}));
  EXPECT_DOUBLE_EQ(mean_accepted_length(h), 1.0);
}

TEST(AcceptedLength, SequenceEndCountsOnlyRealPositions) {
  // The block runs past the end of its sequence after two slots (padding labels 0 equal the
  // drafted 0s), and another runs into masked positions: only the real slots count.
  auto tokens = torch::tensor({{5, 6, 0, 0}, {5, 6, 7, 8}}, torch::kInt64);
  auto target = torch::tensor({{5, 6, 0, 0}, {5, 6, 7, 8}}, torch::kInt64);
  auto supervised = torch::tensor({{true, true, false, false}, {true, true, true, false}});
  auto h = histogram_of(tokens, target, supervised);
  EXPECT_EQ(h, (std::vector<int64_t>{0, 0, 1, 1, 0}));
  EXPECT_DOUBLE_EQ(mean_accepted_length(h), (3.0 + 4.0) / 2);
  // A masked slot in the middle ends the accepted prefix, though later slots match.
  auto gap = torch::tensor({{true, false, true, true}});
  EXPECT_EQ(histogram_of(labels(), labels(), gap), (std::vector<int64_t>{0, 1, 0, 0, 0}));
}

TEST(AcceptedLength, AcceptanceByPositionOnAHandBuiltSet) {
  auto tokens = torch::tensor({{5, 6, 7, 8},    // 4 accepted
                               {5, 6, 7, 0},    // 3
                               {5, 0, 7, 8},    // 1
                               {0, 6, 7, 8},    // 0
                               {5, 6, 0, 8}},   // 2
                              torch::kInt64);
  auto h = histogram_of(tokens, labels().expand({5, 4}), torch::ones({5, 4}, torch::kBool));
  EXPECT_EQ(h, (std::vector<int64_t>{1, 1, 1, 1, 1}));
  EXPECT_DOUBLE_EQ(mean_accepted_length(h), 3.0);
  const auto by_position = acceptance_by_position(h);
  ASSERT_EQ(by_position.size(), 4u);
  const std::vector<double> expected = {0.8, 0.6, 0.4, 0.2};  // first k all accepted
  for (size_t k = 0; k < 4; ++k) EXPECT_DOUBLE_EQ(by_position[k], expected[k]) << "k = " << k + 1;
}

TEST(AcceptedLength, NoBlocksGiveZeros) {
  const std::vector<int64_t> empty = {0, 0, 0};
  EXPECT_DOUBLE_EQ(mean_accepted_length(empty), 0.0);
  EXPECT_EQ(acceptance_by_position(empty), (std::vector<double>{0.0, 0.0}));
}

TEST(AcceptanceMetrics, NamesEveryFigure) {
  AcceptanceStats stats;
  stats.blocks = 3;
  stats.backbone_length = 2.5;
  stats.refinement_length = 2.75;
  stats.accuracy = 0.5;
  stats.backbone_by_position = {0.9, 0.4};
  stats.refinement_by_position = {0.95, 0.5};
  auto m = acceptance_metrics(stats);
  EXPECT_EQ(m.at("tau"), 2.5);
  EXPECT_EQ(m.at("tau_refine"), 2.75);
  EXPECT_EQ(m.at("accuracy"), 0.5);
  EXPECT_EQ(m.at("accept_2"), 0.4);
  EXPECT_EQ(m.at("accept_refine_1"), 0.95);
  EXPECT_EQ(m.at("blocks"), 3);
}

// The target accepts whatever was drafted, or nothing (a token the draft never proposes).
class EchoVerifier final : public BlockVerifier {
 public:
  explicit EchoVerifier(bool accept) : accept_(accept) {}
  std::string name() const override { return accept_ ? "echo" : "never"; }
  BlockVerdict verify(const data::DraftBatch&, const DraftPass&, const at::Tensor&,
                      const at::Tensor& tokens, bool) const override {
    return {accept_ ? tokens.clone() : torch::full_like(tokens, -1), at::Tensor()};
  }

 private:
  bool accept_;
};

struct TinyEvaluation {
  core::Config config = tiny_config();
  std::unique_ptr<DSpineObjective> objective = testing::training_objective(config, tiny_settings());
  AcceptanceEvaluator evaluator{tiny_settings(),
                                config.data.seq_len,
                                static_cast<uint64_t>(config.training.seed),
                                objective->draft(),
                                objective->training_model().embed_tokens(),
                                objective->training_model().lm_head()};
  // Row 0 supervised from position 2 to the end, row 1 from 1 to 8 of 12.
  std::vector<data::DraftBatch> batches = {
      random_batch(mask_rows({{0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
                              {0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0}}),
                   5)};
  std::shared_ptr<dist::Communicator> comm = dist::make_single_process_communicator();
};

TEST(AcceptanceEvaluator, EveryAcceptedTokenCountsUpToTheSequenceEnd) {
  TinyEvaluation t;
  auto stats = t.evaluator.measure(t.batches, *t.comm, EchoVerifier(true));
  EXPECT_EQ(stats.continuation, "echo");
  ASSERT_GT(stats.blocks, 0);
  // Each block is accepted up to its last supervised slot: τ − 1 = supervised slots per block
  // when the supervision is contiguous, as here.
  EXPECT_DOUBLE_EQ(stats.backbone_length,
                   static_cast<double>(stats.supervised_slots) / stats.blocks + 1.0);
  EXPECT_DOUBLE_EQ(stats.refinement_length, stats.backbone_length);
  EXPECT_GT(stats.backbone_by_position.front(), 0.99);
  EXPECT_LT(stats.backbone_by_position.back(), 1.0);  // blocks near the end are cut short
}

TEST(AcceptanceEvaluator, NothingAcceptedIsTauOne) {
  TinyEvaluation t;
  auto stats = t.evaluator.measure(t.batches, *t.comm, EchoVerifier(false));
  EXPECT_DOUBLE_EQ(stats.backbone_length, 1.0);
  EXPECT_DOUBLE_EQ(stats.refinement_length, 1.0);
  for (double fraction : stats.refinement_by_position) EXPECT_EQ(fraction, 0.0);
  EXPECT_EQ(stats.backbone_histogram.front(), stats.blocks);
}

TEST(AcceptanceEvaluator, DataContinuationIsRepeatableAndMatchesTheAccuracy) {
  TinyEvaluation t;
  auto first = t.evaluator.measure(t.batches, *t.comm);
  auto second = t.evaluator.measure(t.batches, *t.comm);
  EXPECT_EQ(first.continuation, "data");
  EXPECT_EQ(first.backbone_histogram, second.backbone_histogram);
  EXPECT_EQ(first.refinement_histogram, second.refinement_histogram);
  EXPECT_EQ(first.accuracy, second.accuracy);
  // Blocks whose first proposal is accepted are at most the correct first slots.
  EXPECT_LE(first.backbone_by_position.front() * first.blocks,
            first.accuracy * first.supervised_slots + 1e-9);
  EXPECT_GE(first.backbone_length, 1.0);
  EXPECT_LE(first.backbone_length, 4.0);
}

}  // namespace
}  // namespace dspine::objectives

namespace dspine::objectives {
namespace {

// The target's own greedy continuation of ids[row, :anchor + 1], `slots` tokens, decoded one
// token at a time with full forwards (no cache, no batching: the plain definition).
torch::Tensor greedy_continuation(const target::Qwen3Model& target, const torch::Tensor& ids,
                                  int64_t anchor, int64_t slots) {
  auto sequence = ids.narrow(0, 0, anchor + 1).unsqueeze(0);
  std::vector<int64_t> out;
  for (int64_t j = 0; j < slots; ++j) {
    auto hidden = target.forward(sequence, {}).last_hidden_state;
    const int64_t next = target.logits(hidden.select(1, -1)).argmax(-1).item<int64_t>();
    out.push_back(next);
    sequence = torch::cat({sequence, torch::tensor({{next}}, torch::kInt64)}, 1);
  }
  return torch::tensor(out, torch::kInt64);
}

target::Qwen3Model small_target() {
  target::Qwen3Dims dims;
  dims.hidden_size = 32;
  dims.intermediate_size = 64;
  dims.num_hidden_layers = 2;
  dims.num_attention_heads = 4;
  dims.num_key_value_heads = 2;
  dims.head_dim = 8;
  dims.vocab_size = 50;
  return target::Qwen3Model::random(dims, 3, torch::kFloat32, torch::kCPU);
}

TEST(TargetVerifier, AcceptsTheTargetsGreedyContinuationAndStopsAtTheFirstMiss) {
  const auto target = small_target();
  const int64_t vocab = target.dims().vocab_size;
  torch::manual_seed(0);
  data::DraftBatch batch;
  batch.input_ids = torch::randint(0, vocab, {2, 12}, torch::kInt64);
  const int64_t slots = 3;
  // Row 0 anchors 2 and 7, row 1 anchor 4 (its second block unused): kept blocks 0, 1, 2.
  DraftPass pass;
  pass.blocks.anchors = torch::tensor({{2, 7}, {4, 0}}, torch::kInt64);
  auto kept = torch::tensor({0, 1, 2}, torch::kInt64);
  auto greedy = torch::stack({greedy_continuation(target, batch.input_ids[0], 2, slots),
                              greedy_continuation(target, batch.input_ids[0], 7, slots),
                              greedy_continuation(target, batch.input_ids[1], 4, slots)});
  // A miss in slot 1 of block 0 as the second candidate: the target still answers slot 0 and
  // slot 1 from the prefix, so exactly one token is accepted there.
  auto missed = greedy.clone();
  missed[0][1] = (greedy[0][1] + 1) % vocab;
  auto tokens = torch::stack({greedy, missed}, 1);  // [K, G = 2, T]
  const auto all = torch::ones({3, slots}, torch::kBool);

  TargetVerifier cached(target);
  PerBlockTargetVerifier per_block(target, /*chunk_blocks=*/4);  // two chunks: padding and seams
  for (const BlockVerifier* verifier : {static_cast<const BlockVerifier*>(&cached),
                                        static_cast<const BlockVerifier*>(&per_block)}) {
    EXPECT_EQ(verifier->name(), "online target");
    auto answer = verifier->verify(batch, pass, kept, tokens, /*with_probs=*/false).choices;
    EXPECT_TRUE(torch::equal(answer.select(1, 0), greedy)) << answer << greedy;
    auto h = accepted_histogram(greedy, answer.select(1, 0), all);
    EXPECT_EQ(h[slots].item<int64_t>(), 3);  // every block fully accepted: τ = block_size
    EXPECT_EQ(answer[0][1][0].item<int64_t>(), greedy[0][0].item<int64_t>());
    EXPECT_EQ(answer[0][1][1].item<int64_t>(), greedy[0][1].item<int64_t>());
    h = accepted_histogram(missed, answer.select(1, 1), all);
    EXPECT_EQ(h[1].item<int64_t>(), 1);
    EXPECT_EQ(h[slots].item<int64_t>(), 2);
  }
}

// The cached verifier against its reference on random drafts: the same target tokens and the
// same probabilities of the drafted tokens, for blocks anywhere in the row (the first position,
// the last, past the end) and several candidates per block.
TEST(TargetVerifier, CachedBranchesEqualOneForwardPerBlock) {
  const auto target = small_target();
  const int64_t vocab = target.dims().vocab_size;
  torch::manual_seed(5);
  data::DraftBatch batch;
  batch.input_ids = torch::randint(0, vocab, {3, 10}, torch::kInt64);
  DraftPass pass;
  pass.blocks.anchors = torch::tensor({{0, 9, 5}, {3, 3, 8}, {1, 6, 2}}, torch::kInt64);
  auto kept = torch::tensor({0, 1, 2, 3, 5, 7, 8}, torch::kInt64);  // row 1 keeps one twin
  for (int64_t slots : {1, 4}) {
    auto tokens = torch::randint(0, vocab, {kept.size(0), 3, slots}, torch::kInt64);
    const auto cached = TargetVerifier(target).verify(batch, pass, kept, tokens, true);
    const auto reference =
        PerBlockTargetVerifier(target, 5).verify(batch, pass, kept, tokens, true);
    EXPECT_TRUE(torch::equal(cached.choices, reference.choices)) << "slots " << slots;
    EXPECT_TRUE(torch::allclose(cached.token_probs, reference.token_probs, 1e-5, 1e-6))
        << (cached.token_probs - reference.token_probs).abs().max();
  }
}

// Without an online target the target's states in the data answer: its argmax and softmax after
// the data's prefix, the same for every candidate of a block.
TEST(TeacherVerifier, AnswersWithTheTeachersDistributionAfterTheDataPrefix) {
  torch::manual_seed(9);
  DraftPass pass;
  pass.teacher_states = torch::randn({2 * 6, 8});
  pass.teacher_positions = torch::tensor({{0, 1, 2}, {7, 8, 9}}, torch::kInt64);
  auto lm_head = torch::randn({20, 8});
  auto kept = torch::tensor({1, 0}, torch::kInt64);
  auto tokens = torch::randint(0, 20, {2, 2, 3}, torch::kInt64);
  const auto verdict = TeacherVerifier(lm_head, 1).verify({}, pass, kept, tokens, true);
  auto probs = torch::softmax(teacher_hidden(pass, kept).matmul(lm_head.t()), -1);  // [K, T, V]
  EXPECT_TRUE(torch::equal(verdict.choices.select(1, 1), probs.argmax(-1)));
  EXPECT_TRUE(torch::equal(verdict.choices.select(1, 0), verdict.choices.select(1, 1)));
  auto expected = probs.gather(2, tokens.permute({0, 2, 1})).permute({0, 2, 1});
  EXPECT_TRUE(torch::allclose(verdict.token_probs, expected, 1e-5, 1e-7));
}

// Overlapping blocks share target positions, each projected once: the verdict is the one of every
// slot projected on its own, whatever the chunking of the distinct positions.
TEST(TeacherVerifier, SharedPositionsAnswerLikeEverySlotOnItsOwn) {
  torch::manual_seed(10);
  DraftPass pass;
  pass.teacher_states = torch::randn({2 * 6, 8});
  pass.teacher_positions =
      torch::tensor({{0, 1, 2}, {1, 2, 3}, {2, 3, 4}, {7, 8, 9}}, torch::kInt64);
  auto lm_head = torch::randn({20, 8});
  auto kept = torch::tensor({2, 0, 3, 1}, torch::kInt64);
  auto tokens = torch::randint(0, 20, {4, 3, 3}, torch::kInt64);
  auto probs = torch::softmax(teacher_hidden(pass, kept).matmul(lm_head.t()), -1);  // [K, T, V]
  auto expected = probs.gather(2, tokens.permute({0, 2, 1})).permute({0, 2, 1});
  for (int64_t chunk_blocks : {0, 1, 2}) {  // 8 distinct positions in 1, 3 and 2 chunks
    const auto verdict = TeacherVerifier(lm_head, chunk_blocks).verify({}, pass, kept, tokens, true);
    for (int64_t g = 0; g < 3; ++g)
      EXPECT_TRUE(torch::equal(verdict.choices.select(1, g), probs.argmax(-1))) << chunk_blocks;
    EXPECT_TRUE(torch::allclose(verdict.token_probs, expected, 1e-5, 1e-7)) << chunk_blocks;
  }
}

TEST(TargetVerifier, IsChosenForASourceWithAnOnlineTargetOnly) {
  const core::Config config;  // the synthetic target
  auto source = data::make_batch_source(config, torch::kCPU);
  EXPECT_EQ(make_verifier(*source)->name(), "data");
}

}  // namespace
}  // namespace dspine::objectives
