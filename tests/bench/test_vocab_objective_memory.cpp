// The fused vocabulary objective's memory claim on CPU, measured by the counting CPU allocator: with
// row chunks it never holds a [rows, V] fp32 tensor (its peak stays below half of one), while the
// unfused formulation of the same terms holds several; and the default chunk size at the recipe's
// vocabulary.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "bench/cpu_memory.h"
#include "ops/vocab_objective_ops.h"

namespace dspine::ops {
namespace {

TEST(VocabObjectiveMemory, ChunksNeverHoldARowsByVocabularyFp32Tensor) {
  auto& tracker = bench::CpuMemoryTracker::install();
  const int64_t rows = 256, hidden = 16, vocab = 1024;
  const int64_t full_bytes = rows * vocab * 4;
  torch::manual_seed(2);
  auto x = torch::randn({rows, hidden}).requires_grad_(true);
  const auto teacher = torch::randn({rows, hidden});
  const auto labels = torch::randint(0, vocab, {rows}, torch::kInt64);
  const auto weights = torch::rand({rows});
  const auto lm_head = torch::randn({vocab, hidden});

  VocabObjectiveOptions o;
  o.ce_weight = 0.1;
  o.top_k = 4;
  o.chunk_rows = 8;
  tracker.reset_peak();
  auto base = tracker.current_bytes();
  {
    auto r = vocab_objective(x, teacher, labels, weights, lm_head, o);
    r.loss.backward();
  }
  EXPECT_LT(tracker.peak_bytes() - base, full_bytes / 2);

  x.mutable_grad() = torch::Tensor();
  tracker.reset_peak();
  base = tracker.current_bytes();
  {
    auto log_p = torch::log_softmax(x.matmul(lm_head.t()), -1);
    auto q = torch::softmax(teacher.matmul(lm_head.t()), -1);
    auto ce = -log_p.gather(1, labels.unsqueeze(1)).squeeze(1);
    auto l1 = (log_p.exp() - q).abs().sum(-1);
    (weights * (0.1 * ce + 0.9 * l1)).sum().backward();
  }
  EXPECT_GT(tracker.peak_bytes() - base, 3 * full_bytes);  // the tracker sees the full width
}

TEST(VocabObjectiveMemory, DefaultChunksKeepTwoBf16LogitsNearSixTenthsOfAGib) {
  // The recipe: V = 151,936 in bf16, draft and teacher logits per row.
  EXPECT_EQ(vocab_chunk_rows(151936, 2, 2), 1024);  // 1,059 fit, rounded to 256-row tiles
  EXPECT_EQ(vocab_chunk_rows(151936, 2, 1), 2048);  // the CE-only prepass: 2,118 fit
  EXPECT_EQ(vocab_chunk_rows(int64_t(1) << 22, 4, 2), 19);  // under one tile: as the budget gives
  EXPECT_LE(vocab_chunk_rows(151936, 2, 2) * 151936 * 2 * 2, kVocabChunkBytes);
  EXPECT_EQ(vocab_chunk_rows(int64_t(1) << 40, 4, 2), 1);
}

}  // namespace
}  // namespace dspine::ops
