// SpecForge offline samples written by the venv's torch (tests/data/make_specforge_samples.py)
// read back through data.source: specforge.
#include <cstdlib>
#include <filesystem>
#include <string>
#include <unistd.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/expect_error.h"
#include "core/files.h"
#include "core/safetensors.h"
#include "data/batch_source.h"
#include "data/specforge_source.h"

namespace dspine::data {
namespace {

using dspine::testing::expect_error_mentioning;
namespace fs = std::filesystem;

class Specforge : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = (fs::temp_directory_path() / fmt::format("dspine-test-specforge-{}", getpid())).string();
    core::remove_tree(root_);
    const std::string command = fmt::format("\"{}\" \"{}/tests/data/make_specforge_samples.py\" \"{}\"",
                                            DSPINE_PYTHON, DSPINE_SOURCE_DIR, root_);
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  static void TearDownTestSuite() { core::remove_tree(root_); }

  static core::Config config() {
    core::Config c;
    c.model.hidden_size = 4;
    c.model.vocab_size = 16;
    c.model.target_layer_ids = {1, 3};
    c.data.seq_len = 8;
    c.data.source = dspine::core::DataSource::kSpecforge;
    c.data.specforge_dir = root_ + "/samples";
    c.data.target.path = root_ + "/target";
    return c;
  }
  static at::Tensor expected(const std::string& name) {
    return core::load_safetensors(root_ + "/expected.safetensors").at(name);
  }
  // Sample `number` cut or padded to 8 positions, as the reader must serve it.
  static at::Tensor fitted(int number, const std::string& key) {
    const at::Tensor t = expected(fmt::format("{}.{}", number, key));
    if (t.size(0) >= 8) return t.narrow(0, 0, 8);
    std::vector<int64_t> shape = t.sizes().vec();
    shape[0] = 8 - t.size(0);
    return torch::cat({t, torch::zeros(shape, t.options())});
  }

  static std::string root_;
};
std::string Specforge::root_;

TEST_F(Specforge, SamplesMapOntoDraftBatchInSampleOrder) {
  const auto files = list_specforge_samples(root_ + "/samples");
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(fs::path(files[2]).filename(), "data_10.ckpt");  // numeric order, not by name

  auto source = make_batch_source(config(), torch::kCPU);
  source->seek(1);
  const DraftBatch batch = source->next(3);  // samples 1, 10, then 0 again (epoch 2)
  EXPECT_EQ(source->cursor(), 4);
  int row = 0;
  for (int number : {1, 10, 0}) {
    const DraftBatch b = batch.slice_rows(row, row + 1);
    EXPECT_TRUE(torch::equal(b.input_ids[0], fitted(number, "input_ids"))) << number;
    EXPECT_TRUE(torch::equal(b.loss_mask[0], fitted(number, "loss_mask"))) << number;
    EXPECT_TRUE(torch::equal(b.hidden_states[0], fitted(number, "aux_hidden_state"))) << number;
    EXPECT_TRUE(torch::equal(b.target_last_hidden_states[0], fitted(number, "hidden_state")))
        << number;
    ++row;
  }
  EXPECT_EQ(batch.hidden_states.scalar_type(), torch::kFloat);
  EXPECT_EQ(batch.loss_mask.scalar_type(), torch::kLong);
  const auto target = core::load_safetensors(root_ + "/target/model.safetensors");
  EXPECT_TRUE(torch::equal(source->embed_tokens(), target.at("model.embed_tokens.weight")));
  EXPECT_TRUE(torch::equal(source->lm_head(), target.at("lm_head.weight")));
}

TEST_F(Specforge, BadSamplesAreNamedWithFileAndKey) {
  const ShardLayout layout{8, 4, 16, {1, 3}};
  expect_error_mentioning(
      [&] { read_specforge_sample(root_ + "/missing_key/data_0.ckpt", layout); },
      {"missing_key/data_0.ckpt", "aux_hidden_state"});
  expect_error_mentioning(
      [&] { read_specforge_sample(root_ + "/wrong_shape/data_0.ckpt", layout); },
      {"wrong_shape/data_0.ckpt", "hidden_state", "[5, 5]", "[5, 4]"});
  expect_error_mentioning(
      [&] { read_specforge_sample(root_ + "/target/model.safetensors", layout); },
      {"target/model.safetensors", "torch.save"});
  const ShardLayout three_layers{8, 4, 16, {0, 1, 2}};
  expect_error_mentioning(
      [&] { read_specforge_sample(root_ + "/samples/rows_0-5000/data_0.ckpt", three_layers); },
      {"data_0.ckpt", "aux_hidden_state", "3 target layers"});
  expect_error_mentioning([&] { list_specforge_samples(root_ + "/nowhere"); }, {"nowhere"});
  expect_error_mentioning([&] { list_specforge_samples(root_ + "/target"); }, {"no SpecForge samples"});
  auto c = config();
  c.model.hidden_size = 8;
  expect_error_mentioning(
      [&] { SpecforgeSource(c.data, c.model); },
      {"model.safetensors", "model.embed_tokens.weight", "model.hidden_size = 8"});
}

TEST_F(Specforge, BadSampleFileStopsTheSourceAtConstruction) {
  // data_1 is bad, data_0 good: a source reading samples only when asked would not see it
  // before its second sample.
  auto c = config();
  c.data.specforge_dir = root_ + "/bad_token";
  expect_error_mentioning([&] { SpecforgeSource(c.data, c.model); },
                          {"bad_token/data_1.ckpt", "'input_ids'", "vocabulary"});
  c.data.specforge_dir = root_ + "/missing_key";
  expect_error_mentioning([&] { SpecforgeSource(c.data, c.model); },
                          {"missing_key/data_0.ckpt", "aux_hidden_state"});

  // The held-out source over another directory checks its files too.
  const core::Config fresh = config();
  const SpecforgeSource training(fresh.data, fresh.model);
  expect_error_mentioning([&] { SpecforgeSource(training, root_ + "/wrong_shape"); },
                          {"wrong_shape/data_0.ckpt", "hidden_state", "[5, 5]"});
  EXPECT_EQ(SpecforgeSource(training, root_ + "/samples").distinct_samples(), 3);
}

}  // namespace
}  // namespace dspine::data
