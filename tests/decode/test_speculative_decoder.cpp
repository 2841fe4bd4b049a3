// Speculative decoding is lossless (docs/decoding.md): on the shipped tiny testbed target (fp32,
// CPU), the target alone decodes as transformers' generate(do_sample=False) does; greedy
// speculative decoding gives the target alone's tokens whatever the draft proposes (a DSpine draft,
// and scripted drafts that are right, wrong, or right for a while); at temperature 1 the tokens a
// verification produces have the target's distribution (chi-square tests over 20,000 draws).
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/dspine_tiny.h"
#include "core/error.h"
#include "target/qwen3_model.h"
#include "decode/block_drafter.h"
#include "decode/decoded_blocks.h"
#include "decode/speculative_decoder.h"
#include "decode/verification.h"
#include "model/dspine_draft.h"

namespace dspine::decode {
namespace {

namespace fs = std::filesystem;
const c10::Device kCpu(c10::kCPU);
constexpr int64_t kEos = 257;  // the testbed target's

const target::Qwen3Model& testbed_target() {
  static const target::Qwen3Model model = target::Qwen3Model::load_hf(
      (fs::path(DSPINE_SOURCE_DIR) / "assets" / "testbed-tiny" / "target").string(), torch::kFloat,
      kCpu);
  return model;
}

// A DSpine draft of the testbed's training shape (configs/testbed-dspine.yaml), random weights.
model::DSpineDraft testbed_draft(int64_t block_size) {
  model::DSpineModelConfig c = testing::tiny_model_config();  // reference kernels
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.head_dim = 16;
  c.vocab_size = 260;
  c.block_size = block_size;
  c.mask_token_id = -1;
  c.target_layer_ids = {1, 2, 3};
  c.dspine = {32, 16, 8, 3};  // transfer rank, message size, top-k, replacement layers
  torch::manual_seed(5);
  model::DSpineDraft draft(c, false);
  draft->initialize_transfer_space(testbed_target().lm_head());
  return draft;
}

std::vector<std::vector<int64_t>> byte_prompts() {
  std::vector<std::vector<int64_t>> prompts;
  for (const std::string text :
       {"def main():\n    ", "import os\nimport sys\n", "class ", "    return self.", "# "}) {
    prompts.emplace_back(text.begin(), text.end());
  }
  return prompts;
}

// Stops at the target's EOS at temperature 0; samples every token asked for otherwise.
DecodeResult decode(Drafter* drafter, const std::vector<std::vector<int64_t>>& prompts,
                    int64_t max_new_tokens, double temperature = 0.0, uint64_t seed = 0) {
  DecodeSettings settings;
  settings.max_new_tokens = max_new_tokens;
  settings.temperature = temperature;
  settings.seed = seed;
  if (temperature == 0.0) settings.stop_tokens = {kEos};
  return SpeculativeDecoder(testbed_target(), drafter, settings).decode(prompts);
}

// Proposes each row's true continuation (`sequences`: prompt and then what the target alone
// generates) through one-hot logits, except where `wrong(position, row)` says to propose the next
// token id instead. Only position information is used, so it tests the loop's bookkeeping.
class ScriptedDrafter : public Drafter {
 public:
  ScriptedDrafter(std::vector<std::vector<int64_t>> sequences, int64_t proposals,
                  std::function<bool(int64_t, int64_t)> wrong)
      : sequences_(std::move(sequences)), proposals_(proposals), wrong_(std::move(wrong)) {}
  int64_t proposals() const override { return proposals_; }
  std::vector<int64_t> target_layer_ids() const override { return {1}; }
  bool start(int64_t batch, int64_t) override {
    rows_ = batch;
    return false;
  }
  void extend(const at::Tensor& hidden, const core::RowSpans& spans) override {
    EXPECT_EQ(hidden.size(0), rows_);
    EXPECT_EQ(spans.positions.sizes(), hidden.sizes().slice(0, 2));
    EXPECT_GE(spans.keys, spans.positions.max().item<int64_t>() + 1);
  }
  DraftedBlock propose(const core::RowSpans& block, const at::Tensor&,
                       const DraftDraws& draws) override {
    const auto anchors = block.positions.select(1, 0).contiguous();
    const int64_t rows = anchors.size(0), vocab = 260;
    EXPECT_EQ(rows, rows_);
    EXPECT_EQ(block.positions.size(1), proposals_ + 1);
    EXPECT_GE(block.keys, anchors.max().item<int64_t>() + proposals_ + 1);
    auto out = torch::zeros({rows, proposals_, vocab});
    for (int64_t b = 0; b < rows; ++b) {
      for (int64_t j = 0; j < proposals_; ++j) {
        const int64_t position = anchors[b].item<int64_t>() + 1 + j;
        const auto& seq = sequences_[b];
        int64_t token = position < static_cast<int64_t>(seq.size()) ? seq[position] : 0;
        if (wrong_(position, b)) token = (token + 1) % vocab;
        out[b][j][token] = 30.0;
      }
    }
    return draw_from_logits(out, draws);
  }

 private:
  std::vector<std::vector<int64_t>> sequences_;
  int64_t proposals_;
  std::function<bool(int64_t, int64_t)> wrong_;
  int64_t rows_ = 0;
};

std::vector<std::vector<int64_t>> tokens_of(const DecodeResult& result) {
  std::vector<std::vector<int64_t>> tokens;
  for (const auto& row : result.rows) tokens.push_back(row.tokens);
  return tokens;
}

TEST(SpeculativeDecoder, TargetAloneEqualsTransformersGreedyGeneration) {
  const fs::path path = fs::path(DSPINE_TINY_QWEN3_DIR) / "testbed-greedy.json";
  std::ifstream file(path);
  ASSERT_TRUE(file) << path << " is missing: run the ctest fixture make_tiny_qwen3 first";
  const auto reference = nlohmann::json::parse(file);
  const auto prompts = reference["prompts"].get<std::vector<std::vector<int64_t>>>();
  const auto generated = reference["generated"].get<std::vector<std::vector<int64_t>>>();
  // All prompts as one batch (rows of different lengths), then one at a time.
  EXPECT_EQ(tokens_of(decode(nullptr, prompts, 24)), generated);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(decode(nullptr, {prompts[i]}, 24).rows[0].tokens, generated[i]) << "prompt " << i;
  }
}

TEST(SpeculativeDecoder, GreedyOutputIsTheTargetAlonesWhateverTheDraftProposes) {
  const auto prompts = byte_prompts();
  const int64_t length = 40;
  const auto alone = decode(nullptr, prompts, length);
  EXPECT_DOUBLE_EQ(alone.tau(), 1.0);
  std::vector<std::vector<int64_t>> sequences;
  for (size_t b = 0; b < prompts.size(); ++b) {
    sequences.push_back(prompts[b]);
    sequences.back().insert(sequences.back().end(), alone.rows[b].tokens.begin(),
                            alone.rows[b].tokens.end());
  }
  struct Case {
    const char* name;
    int64_t proposals;
    std::function<bool(int64_t, int64_t)> wrong;
  };
  const std::vector<Case> cases = {
      {"always right", 3, [](int64_t, int64_t) { return false; }},
      {"always right, long blocks", 7, [](int64_t, int64_t) { return false; }},
      {"always wrong", 3, [](int64_t, int64_t) { return true; }},
      {"wrong now and then", 5, [](int64_t p, int64_t b) { return (p * 7 + b) % 5 == 0; }},
  };
  for (const auto& c : cases) {
    ScriptedDrafter drafter(sequences, c.proposals, c.wrong);
    for (int64_t batch : {int64_t{1}, static_cast<int64_t>(prompts.size())}) {
      std::vector<std::vector<int64_t>> got;
      DecodeResult last;
      for (size_t begin = 0; begin < prompts.size(); begin += batch) {
        const auto part = std::vector<std::vector<int64_t>>(
            prompts.begin() + begin, prompts.begin() + std::min(prompts.size(), begin + batch));
        last = decode(&drafter, part, length);
        for (const auto& row : last.rows) got.push_back(row.tokens);
      }
      EXPECT_EQ(got, tokens_of(alone)) << c.name << ", batch " << batch;
      if (batch == 1) continue;
      // The whole batch: τ as the script says.
      if (std::string(c.name) == "always wrong") EXPECT_DOUBLE_EQ(last.tau(), 1.0);
      if (std::string(c.name).rfind("always right", 0) == 0) {
        EXPECT_GT(last.tau(), 0.8 * (c.proposals + 1)) << c.name;
      }
      if (std::string(c.name) == "wrong now and then") {
        EXPECT_GT(last.tau(), 1.5);
        EXPECT_LT(last.tau(), c.proposals + 1.0);
      }
    }
  }
}

TEST(SpeculativeDecoder, GreedyOutputWithADSpineDraftIsTheTargetAlones) {
  const auto prompts = byte_prompts();
  const auto alone = decode(nullptr, prompts, 32);
  for (int64_t block_size : {4, 8}) {
    for (DraftWalk walk : {DraftWalk::kBackbone, DraftWalk::kRefinement}) {
      const auto draft = testbed_draft(block_size);
      BlockDrafter drafter(draft, testbed_target().embed_tokens(), testbed_target().lm_head(),
                           walk);
      const auto result = decode(&drafter, prompts, 32);
      EXPECT_EQ(tokens_of(result), tokens_of(alone))
          << "block size " << block_size << (walk == DraftWalk::kRefinement ? ", refinement" : "");
      int64_t verified = 0;
      for (const auto& row : result.rows) {
        for (int64_t kept : row.accepted) {
          EXPECT_GE(kept, 1);
          EXPECT_LE(kept, block_size);
          verified += kept;
        }
        EXPECT_EQ(verified, static_cast<int64_t>(row.tokens.size()) - 1);  // the prefill's first
        verified = 0;
      }
    }
  }
}

// decoded_blocks from a decoding's counts: its anchors are the positions the draft was asked to
// continue, round by round, and each block's supervised slots end at the round's first rejected
// draft (or at the block's end when every draft was accepted).
TEST(DecodedBlocks, AnchorsAreTheRoundsAndSlotsEndAtTheFirstRejection) {
  const auto prompts = byte_prompts();
  const int64_t length = 40, proposals = 5;
  const auto alone = decode(nullptr, prompts, length);
  std::vector<std::vector<int64_t>> sequences;
  for (size_t b = 0; b < prompts.size(); ++b) {
    sequences.push_back(prompts[b]);
    sequences.back().insert(sequences.back().end(), alone.rows[b].tokens.begin(),
                            alone.rows[b].tokens.end());
  }
  const auto wrong = [](int64_t p, int64_t b) { return (p * 7 + b) % 5 == 0; };
  // Records the anchor of every block the loop asks for (one row at a time: batch 1).
  class Recording : public ScriptedDrafter {
   public:
    using ScriptedDrafter::ScriptedDrafter;
    DraftedBlock propose(const core::RowSpans& block, const at::Tensor& anchors,
                         const DraftDraws& draws) override {
      asked.push_back(block.positions[0][0].item<int64_t>());
      return ScriptedDrafter::propose(block, anchors, draws);
    }
    std::vector<int64_t> asked;
  };
  for (size_t b = 0; b < prompts.size(); ++b) {
    // Row b's script, as the only row of its batch.
    Recording drafter({sequences[b]}, proposals,
                      [&](int64_t p, int64_t) { return wrong(p, static_cast<int64_t>(b)); });
    const auto result = decode(&drafter, {prompts[b]}, length);
    const auto& row = result.rows[0];
    const int64_t prompt_length = static_cast<int64_t>(prompts[b].size());
    const auto blocks = decoded_blocks(prompt_length, row, proposals);
    EXPECT_EQ(blocks.anchors, drafter.asked) << "prompt " << b;
    ASSERT_EQ(blocks.supervised_slots.size(), blocks.anchors.size());
    for (size_t r = 0; r < blocks.anchors.size(); ++r) {
      const int64_t anchor = blocks.anchors[r], slots = blocks.supervised_slots[r];
      ASSERT_GE(slots, 1);
      ASSERT_LE(slots, proposals);
      for (int64_t j = 1; j < slots; ++j) {
        EXPECT_FALSE(wrong(anchor + j, static_cast<int64_t>(b))) << "accepted slot " << j;
      }
      // Every round but the last (which the length limit may cut) ends at a rejected draft or
      // with the whole block accepted.
      if (r + 1 < blocks.anchors.size() && slots < proposals) {
        EXPECT_TRUE(wrong(anchor + slots, static_cast<int64_t>(b))) << "round " << r;
      }
    }
  }
  DecodedRow bad;
  bad.tokens = {1, 2, 3};
  bad.accepted = {1};  // one verification kept 1 token: 2 tokens in all, not 3
  EXPECT_THROW(decoded_blocks(4, bad, proposals), Error);
  bad.accepted = {2};
  EXPECT_EQ(decoded_blocks(4, bad, proposals).anchors, std::vector<int64_t>({4}));
  bad.accepted = {0, 2};
  EXPECT_THROW(decoded_blocks(4, bad, proposals), Error);
}

// Pearson's statistic of `counts` against probabilities `expected` (bins whose expected count is
// below 5 merged into one), and the chi-square quantile of its degrees of freedom at p = 1e-4
// (Wilson-Hilferty).
std::pair<double, double> chi_square(const std::vector<int64_t>& counts,
                                     const std::vector<double>& expected, int64_t draws) {
  double statistic = 0, rest_observed = 0, rest_expected = 0;
  int64_t bins = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = expected[i] * static_cast<double>(draws);
    if (e < 5) {
      rest_observed += static_cast<double>(counts[i]);
      rest_expected += e;
      continue;
    }
    statistic += std::pow(static_cast<double>(counts[i]) - e, 2) / e;
    ++bins;
  }
  if (rest_expected > 0) {
    statistic += std::pow(rest_observed - rest_expected, 2) / std::max(rest_expected, 1e-9);
    ++bins;
  }
  const double df = static_cast<double>(bins - 1), z = 3.719;
  const double quantile = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
  return {statistic, quantile};
}

std::vector<int64_t> token_counts(const at::Tensor& tokens, int64_t bins) {
  const auto counts = torch::bincount(tokens.reshape(-1), {}, bins).to(torch::kInt64).contiguous();
  return {counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + bins};
}

std::vector<double> probabilities(const at::Tensor& p) {
  const auto d = p.to(torch::kDouble).contiguous();
  return {d.data_ptr<double>(), d.data_ptr<double>() + d.numel()};
}

// The rule alone: fixed p and q over 12 tokens, 2 slots, 40,000 rows. The first output token
// must follow p_0 whether the draft's token is kept or replaced, the second p_1.
TEST(Verification, SampledRuleKeepsTheTargetsDistribution) {
  const int64_t rows = 40000, slots = 2, vocab = 12;
  torch::manual_seed(3);
  const auto p = torch::softmax(torch::randn({slots + 1, vocab}) * 1.5, -1);
  const auto q = torch::softmax(torch::randn({slots, vocab}) * 1.5, -1);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(11);
  const auto target = p.unsqueeze(0).expand({rows, slots + 1, vocab}).contiguous();
  const auto draft = q.unsqueeze(0).expand({rows, slots, vocab}).contiguous();
  const auto drafted = sample_rows(draft.view({-1, vocab}), generator).view({rows, slots});
  const auto verdict = verify_sampled(target, draft, drafted, generator);
  // Slot 0's acceptance rate is Σ min(p, q).
  const double accepted = verdict.accepted.ge(1).to(torch::kDouble).mean().item<double>();
  EXPECT_NEAR(accepted, torch::minimum(p[0], q[0]).sum().item<double>(), 0.01);
  for (int64_t slot = 0; slot < 2; ++slot) {
    // Output token `slot` exists where at least `slot` tokens were accepted before it.
    const auto reached = verdict.accepted.ge(slot);
    const auto tokens = verdict.tokens.select(1, slot).masked_select(reached);
    const auto [statistic, quantile] =
        chi_square(token_counts(tokens, vocab), probabilities(p[slot]), tokens.numel());
    EXPECT_LT(statistic, quantile) << "output token " << slot << " of " << tokens.numel();
  }
}

// End to end at temperature 1: 20,000 copies of one prompt, two tokens each. The first comes from
// the prefill, the second from the first verification (a draft's token kept, or the residual's):
// both must have the target's distribution, the second's being Σ_x p(x | prompt) p(· | prompt, x).
TEST(SpeculativeDecoder, SampledTokensHaveTheTargetsDistribution) {
  const auto& target = testbed_target();
  const std::string text = "import ";
  const std::vector<int64_t> prompt(text.begin(), text.end());
  const int64_t draws = 20000, vocab = 260;
  torch::NoGradGuard no_grad;
  const auto ids = torch::tensor(prompt, torch::kInt64).unsqueeze(0);
  const auto first =
      torch::softmax(target.logits(target.forward(ids, {}).last_hidden_state)[0][-1], -1);
  const auto extended = torch::cat({ids.expand({vocab, -1}), torch::arange(vocab).unsqueeze(1)}, 1);
  const auto second_given = torch::softmax(
      target.logits(target.forward(extended, {}).last_hidden_state).select(1, -1), -1);
  const auto second = (first.unsqueeze(1) * second_given).sum(0);

  const auto draft = testbed_draft(4);
  BlockDrafter dspine_drafter(draft, target.embed_tokens(), target.lm_head());
  BlockDrafter refinement_drafter(draft, target.embed_tokens(), target.lm_head(),
                                  DraftWalk::kRefinement);
  // A draft that proposes the target's most likely continuation: its slot 0 is often kept.
  std::vector<std::vector<int64_t>> likely(draws, prompt);
  const int64_t top = first.argmax().item<int64_t>();
  const int64_t top_second = second_given[top].argmax().item<int64_t>();
  for (auto& s : likely) s.insert(s.end(), {top, top_second, 0, 0, 0});
  ScriptedDrafter scripted(likely, 3, [](int64_t, int64_t) { return false; });
  for (Drafter* drafter : std::vector<Drafter*>{&dspine_drafter, &refinement_drafter, &scripted}) {
    const auto result =
        decode(drafter, std::vector<std::vector<int64_t>>(draws, prompt), 2, 1.0, 9);
    std::vector<int64_t> tokens[2];
    for (const auto& row : result.rows) {
      ASSERT_EQ(row.tokens.size(), 2u);
      for (int k = 0; k < 2; ++k) tokens[k].push_back(row.tokens[k]);
    }
    const std::vector<double> expected[2] = {probabilities(first), probabilities(second)};
    for (int k = 0; k < 2; ++k) {
      const auto [statistic, quantile] =
          chi_square(token_counts(torch::tensor(tokens[k]), vocab), expected[k], draws);
      EXPECT_LT(statistic, quantile) << (drafter == &scripted             ? "scripted"
                                         : drafter == &refinement_drafter ? "DSpine refinement walk"
                                                                          : "DSpine")
                                     << " draft, token " << k;
    }
  }
}

TEST(SpeculativeDecoder, RefusesBadSettingsAndPrompts) {
  DecodeSettings settings;
  settings.max_new_tokens = 0;
  EXPECT_THROW(SpeculativeDecoder(testbed_target(), nullptr, settings), Error);
  settings.max_new_tokens = 4;
  settings.temperature = -1;
  EXPECT_THROW(SpeculativeDecoder(testbed_target(), nullptr, settings), Error);
  settings.temperature = 0;
  SpeculativeDecoder decoder(testbed_target(), nullptr, settings);
  EXPECT_THROW(decoder.decode({{}}), Error);        // an empty prompt
  EXPECT_THROW(decoder.decode({{1, 260}}), Error);  // an id outside the vocabulary
}

}  // namespace
}  // namespace dspine::decode
