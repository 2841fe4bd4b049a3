// The draft's decoding cache (model/draft_decoding.h, docs/decoding.md "The draft's cache"): a
// block drafted against cached context keys and values equals the training forward over the whole
// context with that block alone, for rows of different lengths, after the context came in pieces
// and after a block's own keys were written where the context later goes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "common/dspine_tiny.h"
#include "core/error.h"
#include "core/row_spans.h"
#include "model/draft_decoding.h"
#include "model/dspine_draft.h"

namespace dspine::model {
namespace {

constexpr double kTolerance = 2e-5;  // fp32; the two paths sum attention in different orders

struct Fixture {
  DSpineModelConfig config = testing::tiny_model_config();
  DSpineDraft draft{nullptr};
  at::Tensor hidden;  // [B, S, K·H] the target's hidden states of every row's context
  at::Tensor embed;   // [V, H]
  Fixture() {
    torch::manual_seed(23);
    draft = DSpineDraft(config, false);
    draft->initialize_transfer_space(torch::randn({config.vocab_size, config.hidden_size}), 7);
    {  // writes, the predecessor's gate and the bias away from zero: every injection term counts
      torch::NoGradGuard no_grad;
      for (auto& w : draft->injection->write_layers) w->weight.normal_(0.0, 0.1);
      draft->injection->predecessor_gate->weight.normal_(0.0, 0.1);
      draft->injection->bias.normal_(0.0, 0.1);
    }
    hidden = torch::randn({3, 12, 3 * config.hidden_size});
    embed = torch::randn({config.vocab_size, config.hidden_size});
  }

  // Each row's block at anchors[b] (slot 0 token anchor_tokens[b]).
  at::Tensor block_ids(const std::vector<int64_t>& anchor_tokens) const {
    const int64_t rows = static_cast<int64_t>(anchor_tokens.size());
    auto ids = torch::full({rows, config.block_size}, config.mask_token_id, torch::kInt64);
    ids.select(1, 0).copy_(torch::tensor(anchor_tokens, torch::kInt64));
    return ids;
  }

  // The training forward over the whole context, one block per row at anchors[b].
  DraftOutput full(const std::vector<int64_t>& anchors, const at::Tensor& ids) {
    torch::NoGradGuard no_grad;
    const int64_t rows = ids.size(0), seq = hidden.size(1), bs = config.block_size;
    const auto anchor = torch::tensor(anchors, torch::kInt64).view({rows, 1});
    const auto positions = torch::cat(
        {torch::arange(seq).unsqueeze(0).expand({rows, seq}), anchor + torch::arange(bs)}, 1);
    const auto keep = torch::ones({rows, 1}, torch::kBool);
    return draft->forward(positions, anchor, keep, torch::embedding(embed, ids), hidden,
                          ids.view({rows, 1, bs}), at::Tensor(), false);
  }
};

void expect_close(const DraftOutput& got, const DraftOutput& want, const char* what) {
  EXPECT_LT((got.hidden_states - want.hidden_states).abs().max().item<double>(), kTolerance)
      << what;
  EXPECT_LT((got.pre_injection - want.pre_injection).abs().max().item<double>(), kTolerance)
      << what;
}

TEST(DraftDecodingCache, BlocksEqualTheFullForwardForRowsOfTheirOwnLengths) {
  Fixture f;
  DraftDecodingCache cache(*f.draft, 3, 16);
  // The context in two pieces: the first 5 positions of every row, then 5 more.
  cache.extend(f.hidden.narrow(1, 0, 5), {0, 0, 0});
  cache.extend(f.hidden.narrow(1, 5, 5), {5, 5, 5});
  const std::vector<int64_t> anchors = {3, 7, 10};
  const auto ids = f.block_ids({4, 9, 17});
  expect_close(cache.block(anchors, ids, torch::embedding(f.embed, ids)), f.full(anchors, ids),
               "rows at 3, 7 and 10");
}

// Without the pre-injection state the last injection writes into its state in place: the same
// hidden states, no pre_injection.
TEST(DraftDecodingCache, BlockWithoutPreInjectionGivesTheSameHiddenStates) {
  Fixture f;
  DraftDecodingCache cache(*f.draft, 3, 16);
  cache.extend(f.hidden.narrow(1, 0, 10), {0, 0, 0});
  const std::vector<int64_t> anchors = {3, 7, 10};
  const auto ids = f.block_ids({4, 9, 17});
  const auto spans = core::row_spans(anchors, f.config.block_size, torch::kCPU, torch::kFloat);
  const auto noise = torch::embedding(f.embed, ids);
  const auto kept = cache.block(spans, ids, noise);
  const auto bare = cache.block(spans, ids, noise, /*keep_pre_injection=*/false);
  EXPECT_FALSE(bare.pre_injection.defined());
  EXPECT_TRUE(torch::equal(bare.hidden_states, kept.hidden_states));
  expect_close(kept, f.full(anchors, ids), "kept");
}

TEST(DraftDecodingCache, ContextWrittenOverABlocksKeysGivesTheFullForward) {
  Fixture f;
  DraftDecodingCache cache(*f.draft, 3, 16);
  // Rows of 4, 6 and 2 positions (the prefill writes all 6: the rest is padding).
  cache.extend(f.hidden.narrow(1, 0, 6), {0, 0, 0});
  const std::vector<int64_t> first = {4, 6, 2};
  const auto first_ids = f.block_ids({1, 2, 3});
  expect_close(cache.block(first, first_ids, torch::embedding(f.embed, first_ids)),
               f.full(first, first_ids), "first round");
  // The verification's hidden states of each row's block positions, then the next block after
  // 2, 1 and 4 accepted tokens.
  const int64_t bs = f.config.block_size;
  cache.extend(torch::stack({f.hidden[0].narrow(0, 4, bs), f.hidden[1].narrow(0, 6, bs),
                             f.hidden[2].narrow(0, 2, bs)}),
               first);
  const std::vector<int64_t> second = {6, 7, 6};
  const auto second_ids = f.block_ids({5, 6, 7});
  expect_close(cache.block(second, second_ids, torch::embedding(f.embed, second_ids)),
               f.full(second, second_ids), "second round");
}

// The cache decodes with packed copies of the weights: after the draft's weights change (a run
// that trains between evaluations), refresh_weights() makes its blocks the new draft's again.
TEST(DraftDecodingCache, RefreshedWeightsFollowTheDraftsWeights) {
  Fixture f;
  DraftDecodingCache cache(*f.draft, 3, 16);
  const std::vector<int64_t> anchors = {3, 7, 10};
  const auto ids = f.block_ids({4, 9, 17});
  const auto noise = torch::embedding(f.embed, ids);
  {
    torch::NoGradGuard no_grad;  // a trained step's worth of change in every packed weight
    for (auto& layer : f.draft->layer_modules) {
      for (auto* w : {&layer->self_attn->q_proj->weight, &layer->self_attn->k_proj->weight,
                      &layer->self_attn->v_proj->weight, &layer->mlp->gate_proj->weight,
                      &layer->mlp->up_proj->weight}) {
        w->mul_(1.5);
      }
    }
    f.draft->injection->message->weight.mul_(1.5);
    f.draft->injection->predecessor_gate->weight.add_(0.1);
  }
  cache.extend(f.hidden.narrow(1, 0, 10), {0, 0, 0});
  const auto stale = cache.block(anchors, ids, noise);
  EXPECT_GT((stale.hidden_states - f.full(anchors, ids).hidden_states).abs().max().item<double>(),
            100 * kTolerance);
  cache.refresh_weights();
  cache.extend(f.hidden.narrow(1, 0, 10), {0, 0, 0});
  expect_close(cache.block(anchors, ids, noise), f.full(anchors, ids), "after refresh_weights");
}

TEST(DraftDecodingCache, RefusesPositionsPastItsCapacity) {
  Fixture f;
  DraftDecodingCache cache(*f.draft, 3, 8);
  EXPECT_THROW(cache.extend(f.hidden.narrow(1, 0, 9), {0, 0, 0}), Error);
  cache.extend(f.hidden.narrow(1, 0, 5), {0, 0, 0});
  const auto ids = f.block_ids({1, 2, 3});
  EXPECT_THROW(cache.block({5, 5, 5}, ids, torch::embedding(f.embed, ids)), Error);
}

}  // namespace
}  // namespace dspine::model
