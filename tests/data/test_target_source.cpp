// data.source: target on the tiny Hugging Face Qwen3 models of tests/target/make_tiny_qwen3.py
// (ctest fixture make_tiny_qwen3, in DSPINE_TINY_QWEN3_DIR).
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/expect_error.h"
#include "core/files.h"
#include "core/safetensors.h"
#include "data/batch_source.h"
#include "data/target_source.h"

namespace dspine::data {
namespace {

using dspine::testing::expect_error_mentioning;
namespace fs = std::filesystem;

const fs::path kModels = DSPINE_TINY_QWEN3_DIR;

class Target : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kModels / "untied-single" / "expected.safetensors")) {
      GTEST_SKIP() << "no tiny models in " << kModels << " (run ctest, or python "
                   << "tests/target/make_tiny_qwen3.py " << kModels << ")";
    }
    dir_ = fs::temp_directory_path() /
           fmt::format("dspine-test-target-{}-{}", getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    core::remove_tree(dir_.string());
    fs::create_directories(dir_);
  }
  void TearDown() override { core::remove_tree(dir_.string()); }

  // hidden 32, vocab 96, 4 layers; the expected outputs capture layers 0, 2, 3.
  core::Config config(const std::string& model, int64_t seq_len) const {
    core::Config c;
    c.model.hidden_size = 32;
    c.model.vocab_size = 96;
    c.model.target_layer_ids = {0, 2, 3};
    c.data.source = dspine::core::DataSource::kTarget;
    c.data.seq_len = seq_len;
    c.data.synthetic.prompt_length = 2;
    c.data.target.path = (kModels / model).string();
    return c;
  }
  // The expected.safetensors input rows as token samples (loss on all but the first 3 tokens).
  std::string write_samples(const at::Tensor& ids) const {
    const std::string path = (dir_ / "tokens.jsonl").string();
    std::ofstream out(path);
    for (int64_t r = 0; r < ids.size(0); ++r) {
      std::vector<int64_t> row(ids[r].data_ptr<int64_t>(), ids[r].data_ptr<int64_t>() + ids.size(1));
      std::vector<int64_t> mask(row.size(), 1);
      std::fill(mask.begin(), mask.begin() + 3, 0);
      out << fmt::format("{{\"input_ids\": [{}], \"loss_mask\": [{}]}}\n", fmt::join(row, ", "),
                         fmt::join(mask, ", "));
    }
    return path;
  }

  fs::path dir_;
};

TEST_F(Target, BatchesAreTheTargetsHiddenStatesOnTheSamples) {
  const auto expected = core::load_safetensors((kModels / "untied-single" / "expected.safetensors").string());
  const at::Tensor ids = expected.at("input_ids");  // [2, 11]
  auto c = config("untied-single", ids.size(1));
  c.data.samples = write_samples(ids);
  auto source = make_batch_source(c, torch::kCPU);
  source->seek(1);
  const DraftBatch batch = source->next(2);  // samples 1, then 0 (epoch 2)
  const auto order = torch::tensor({1, 0});
  EXPECT_TRUE(torch::equal(batch.input_ids, ids.index_select(0, order)));
  EXPECT_EQ(batch.loss_mask.sum().item<int64_t>(), 2 * (ids.size(1) - 3));
  EXPECT_EQ(batch.hidden_states.scalar_type(), torch::kFloat);  // fp32 on the CPU
  EXPECT_TRUE(torch::allclose(batch.hidden_states, expected.at("hidden_states").index_select(0, order),
                              1e-4, 1e-4));
  EXPECT_TRUE(torch::allclose(batch.target_last_hidden_states,
                              expected.at("last_hidden_state").index_select(0, order), 1e-4, 1e-4));
}

TEST_F(Target, LongSamplesAreCutAndShortOnesPaddedWithoutLoss) {
  const auto expected = core::load_safetensors((kModels / "untied-single" / "expected.safetensors").string());
  auto c = config("untied-single", 6);
  c.data.samples = write_samples(expected.at("input_ids"));
  TargetSource cut(c.data, c.model, at::kFloat, torch::kCPU);
  const DraftBatch a = cut.next(1);
  EXPECT_TRUE(torch::allclose(a.hidden_states[0], expected.at("hidden_states")[0].narrow(0, 0, 6),
                              1e-4, 1e-4));  // causal: the first 6 positions do not see the rest
  c.data.seq_len = 16;
  TargetSource padded(c.data, c.model, at::kFloat, torch::kCPU);
  const DraftBatch b = padded.next(1);
  EXPECT_EQ(b.input_ids.narrow(1, 11, 5).abs().sum().item<int64_t>(), 0);
  EXPECT_EQ(b.loss_mask.narrow(1, 11, 5).sum().item<int64_t>(), 0);
  EXPECT_TRUE(torch::allclose(b.hidden_states[0].narrow(0, 0, 11), expected.at("hidden_states")[0],
                              1e-4, 1e-4));
}

TEST_F(Target, EmbeddingAndLmHeadAreTheTargetsTensors) {
  for (const char* model : {"untied-single", "tied-sharded"}) {
    auto c = config(model, 8);
    c.data.target.random = false;
    c.data.samples = write_samples(torch::arange(8).view({1, 8}));
    TargetSource source(c.data, c.model, at::kFloat, torch::kCPU);
    EXPECT_EQ(source.embed_tokens().data_ptr(), source.model().embed_tokens().data_ptr()) << model;
    EXPECT_EQ(source.lm_head().data_ptr(), source.model().lm_head().data_ptr()) << model;
    EXPECT_EQ(source.online_target(), &source.model()) << model;  // it verifies drafted blocks
    // What the draft does with them (dspine_forward's place()): no copy when device/dtype match.
    EXPECT_EQ(source.lm_head().detach().to(torch::kCPU, torch::kFloat).data_ptr(),
              source.lm_head().data_ptr());
  }
}

TEST_F(Target, RandomTargetFromConfigJsonAndRandomTokensAreSeeded) {
  fs::copy_file(kModels / "untied-single" / "config.json", dir_ / "config.json");
  auto c = config("untied-single", 12);
  c.data.target.path = dir_.string();  // config.json only
  c.data.target.random = true;
  c.data.target.seed = 5;
  TargetSource source(c.data, c.model, at::kFloat, torch::kCPU);
  const DraftBatch first = source.next(3);
  EXPECT_EQ(first.hidden_states.sizes(), torch::IntArrayRef({3, 12, 96}));
  EXPECT_EQ(first.loss_mask.narrow(1, 0, 2).sum().item<int64_t>(), 0);
  EXPECT_EQ(first.loss_mask.narrow(1, 2, 10).sum().item<int64_t>(), 30);
  EXPECT_LT(first.input_ids.max().item<int64_t>(), 95);  // never the mask token (the last id)
  source.seek(1);
  const DraftBatch again = source.next(2);
  EXPECT_TRUE(torch::equal(again.input_ids, first.input_ids.narrow(0, 1, 2)));
  EXPECT_TRUE(torch::equal(again.hidden_states, first.hidden_states.narrow(0, 1, 2)));
}

// prefetch() then next() at that cursor hands out the batch computed ahead, bit for bit the batch
// next() computes; other reads compute theirs and leave the ones ahead in place.
TEST_F(Target, BatchesComputedAheadAreTheBatchesReadLater) {
  fs::copy_file(kModels / "untied-single" / "config.json", dir_ / "config.json");
  auto c = config("untied-single", 12);
  c.data.target.path = dir_.string();
  c.data.target.random = true;
  TargetSource ahead(c.data, c.model, at::kFloat, torch::kCPU);
  c.data.target.prefetch = false;
  TargetSource plain(c.data, c.model, at::kFloat, torch::kCPU);
  ahead.prefetch(4, 2);
  ahead.prefetch(0, 3);
  plain.prefetch(4, 2);  // prefetch: false ignores it
  EXPECT_EQ(ahead.batches_ahead(), 2u);
  EXPECT_EQ(plain.batches_ahead(), 0u);
  // {cursor, rows}: computed ahead, computed ahead, another row count, the same cursor again.
  const std::vector<std::pair<int64_t, int64_t>> reads = {{0, 3}, {4, 2}, {4, 1}, {4, 2}};
  const std::vector<size_t> left = {1, 0, 0, 0};
  for (size_t i = 0; i < reads.size(); ++i) {
    const auto [cursor, rows] = reads[i];
    ahead.seek(cursor);
    plain.seek(cursor);
    const DraftBatch a = ahead.next(rows), b = plain.next(rows);
    EXPECT_EQ(ahead.batches_ahead(), left[i]) << "read " << i;
    EXPECT_EQ(ahead.cursor(), cursor + rows);
    for (const auto& [x, y] : {std::pair{a.input_ids, b.input_ids}, {a.loss_mask, b.loss_mask},
                               {a.hidden_states, b.hidden_states},
                               {a.target_last_hidden_states, b.target_last_hidden_states}}) {
      EXPECT_TRUE(torch::equal(x, y)) << "read " << i;
    }
  }
  ahead.prefetch(6, 1);
  ahead.seek(7);
  ahead.next(1);  // another cursor
  EXPECT_EQ(ahead.batches_ahead(), 1u);
}

TEST_F(Target, DimensionsThatDisagreeWithTheConfigAreNamed) {
  auto c = config("untied-single", 8);
  c.data.samples = write_samples(torch::arange(8).view({1, 8}));
  c.model.hidden_size = 64;
  expect_error_mentioning([&] { TargetSource(c.data, c.model, at::kFloat, torch::kCPU); },
                          {"config.json", "hidden_size 32", "model.hidden_size = 64"});
  c = config("untied-single", 8);
  c.data.samples = write_samples(torch::arange(8).view({1, 8}));
  c.model.vocab_size = 100;
  expect_error_mentioning([&] { TargetSource(c.data, c.model, at::kFloat, torch::kCPU); },
                          {"vocab_size 96", "model.vocab_size"});
  c.model.vocab_size = 96;
  c.model.target_layer_ids = {0, 4};
  expect_error_mentioning([&] { TargetSource(c.data, c.model, at::kFloat, torch::kCPU); },
                          {"config.json", "model.target_layer_ids", "num_hidden_layers = 4"});
  c.model.target_layer_ids = {0};
  c.data.samples = (dir_ / "missing.jsonl").string();
  expect_error_mentioning([&] { TargetSource(c.data, c.model, at::kFloat, torch::kCPU); },
                          {"missing.jsonl"});
}

}  // namespace
}  // namespace dspine::data
