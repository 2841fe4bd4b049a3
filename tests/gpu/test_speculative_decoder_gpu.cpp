// Speculative decoding on CUDA runs its rounds as a CUDA graph (decode/round_graph.h): captured
// and replayed rounds must give exactly what eager rounds give (the same tokens, the same accepted
// counts, the same draws at temperature 1), rows that end early included, and greedy speculative
// output must still equal the target alone's. fp32, so that the eager rounds' shorter attention
// (over the longest row, not the whole capacity) rounds alike.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "common/gpu_draft_config.h"
#include "common/require_cuda.h"
#include "target/qwen3_model.h"
#include "decode/block_drafter.h"
#include "decode/speculative_decoder.h"
#include "model/dspine_draft.h"

namespace dspine::decode {
namespace {

const int64_t kVocab = testing::gpu_draft_config().vocab_size;

target::Qwen3Dims target_dims() {
  target::Qwen3Dims d;
  d.hidden_size = 256;
  d.intermediate_size = 512;
  d.num_hidden_layers = 4;
  d.num_attention_heads = 4;
  d.num_key_value_heads = 2;
  d.head_dim = 64;
  d.vocab_size = kVocab;
  return d;
}

struct Models {
  target::Qwen3Model target;
  BlockDrafter drafter;
};

Models models(torch::Dtype dtype) {
  const torch::Device cuda(torch::kCUDA);
  auto target = target::Qwen3Model::random(target_dims(), 5, dtype, cuda);
  torch::manual_seed(43);
  model::DSpineDraft draft(testing::gpu_draft_config(), /*fused=*/dtype != torch::kFloat32);
  draft->initialize_transfer_space(target.lm_head().to(torch::kCPU, torch::kFloat32), 64);
  model::place_draft(*draft, cuda, dtype);
  BlockDrafter drafter(draft, target.embed_tokens(), target.lm_head());
  return {std::move(target), std::move(drafter)};
}

// Rows of different lengths.
std::vector<std::vector<int64_t>> prompts() {
  std::vector<std::vector<int64_t>> out;
  for (int64_t length : {5, 13, 9}) {
    std::vector<int64_t> row;
    for (int64_t i = 0; i < length; ++i) row.push_back((37 * i + 11 * length) % (kVocab - 1));
    out.push_back(row);
  }
  return out;
}

DecodeResult decode(const Models& m, Drafter* drafter, DecodeSettings settings, bool graphs) {
  settings.cuda_graphs = graphs;
  auto result = SpeculativeDecoder(m.target, drafter, settings).decode(prompts());
  EXPECT_EQ(result.cuda_graphs, graphs);
  return result;
}

void expect_same(const DecodeResult& graphed, const DecodeResult& eager) {
  ASSERT_EQ(graphed.rows.size(), eager.rows.size());
  for (size_t b = 0; b < eager.rows.size(); ++b) {
    EXPECT_EQ(graphed.rows[b].tokens, eager.rows[b].tokens) << "row " << b;
    EXPECT_EQ(graphed.rows[b].accepted, eager.rows[b].accepted) << "row " << b;
  }
  EXPECT_EQ(graphed.verifications, eager.verifications);
  EXPECT_EQ(graphed.accepted_by_position, eager.accepted_by_position);
}

TEST(SpeculativeDecoderGpu, GraphedGreedyRoundsGiveTheEagerTokensAndTheTargetAlones) {
  REQUIRE_CUDA();
  auto m = models(torch::kFloat32);
  DecodeSettings settings;
  settings.max_new_tokens = 40;
  const auto graphed = decode(m, &m.drafter, settings, true);
  expect_same(graphed, decode(m, &m.drafter, settings, false));
  const auto alone = decode(m, nullptr, settings, true);
  expect_same(alone, decode(m, nullptr, settings, false));
  for (size_t b = 0; b < alone.rows.size(); ++b) {
    EXPECT_EQ(graphed.rows[b].tokens, alone.rows[b].tokens) << "row " << b;
  }
  // Rows that end early (a stop token the first row meets a few tokens in): the device stops
  // advancing them, the others go on.
  settings.stop_tokens = {alone.rows[0].tokens[6]};
  const auto stopped = decode(m, &m.drafter, settings, true);
  expect_same(stopped, decode(m, &m.drafter, settings, false));
  EXPECT_LE(stopped.rows[0].tokens.size(), 7u);
  std::printf(
      "greedy: tau %.3f over %lld verifications; with a stop token, row lengths %zu %zu %zu\n",
      graphed.tau(), static_cast<long long>(graphed.verifications), stopped.rows[0].tokens.size(),
      stopped.rows[1].tokens.size(), stopped.rows[2].tokens.size());
}

TEST(SpeculativeDecoderGpu, GraphedSamplingDrawsWhatEagerSamplingDraws) {
  REQUIRE_CUDA();
  auto m = models(torch::kFloat32);
  DecodeSettings settings;
  settings.max_new_tokens = 40;
  settings.temperature = 1.0;
  settings.seed = 7;
  const auto graphed = decode(m, &m.drafter, settings, true);
  expect_same(graphed, decode(m, &m.drafter, settings, false));
  // The target alone draws once per round: a replay that drew the captured round's numbers again
  // would differ from eager decoding from the third token on.
  expect_same(decode(m, nullptr, settings, true), decode(m, nullptr, settings, false));
}

TEST(SpeculativeDecoderGpu, Bf16FusedRoundsAreCaptured) {
  REQUIRE_CUDA();
  auto m = models(torch::kBFloat16);
  ASSERT_TRUE(m.target.fused_kernels());
  DecodeSettings settings;
  settings.max_new_tokens = 32;
  for (double temperature : {0.0, 1.0}) {
    settings.temperature = temperature;
    const auto graphed = decode(m, &m.drafter, settings, true);
    for (const auto& row : graphed.rows) EXPECT_EQ(row.tokens.size(), 32u);
    EXPECT_GE(graphed.tau(), 1.0);
  }
}

}  // namespace
}  // namespace dspine::decode
