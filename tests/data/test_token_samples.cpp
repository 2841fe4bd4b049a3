#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/expect_error.h"
#include "data/token_samples.h"

namespace dspine::data {
namespace {

using dspine::testing::expect_error_mentioning;
namespace fs = std::filesystem;

class TokenSamplesTest : public ::testing::Test {
 protected:
  void TearDown() override { fs::remove(path_); }
  std::string write(const std::string& text) {
    std::ofstream(path_, std::ios::binary) << text;
    return path_.string();
  }
  fs::path path_ = fs::temp_directory_path() /
                   fmt::format("dspine-test-tokens-{}-{}.jsonl", getpid(),
                               ::testing::UnitTest::GetInstance()->current_test_info()->name());
};

TEST_F(TokenSamplesTest, ReadsSamplesByIndexSkippingBlankLines) {
  TokenSamples samples(write("{\"input_ids\": [1, 2, 3], \"loss_mask\": [0, 1, 1]}\n"
                             "\n"
                             "{\"loss_mask\": [1], \"input_ids\": [7], \"extra\": \"ignored\"}\n"
                             "{\"input_ids\": [4, 5], \"loss_mask\": [0, 0]}"),  // no final newline
                       10);
  ASSERT_EQ(samples.size(), 3);
  EXPECT_EQ(samples.read(2).input_ids, (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(samples.read(1).input_ids, (std::vector<int64_t>{7}));
  EXPECT_EQ(samples.read(0).loss_mask, (std::vector<int64_t>{0, 1, 1}));
}

TEST_F(TokenSamplesTest, RowsCutLongSamplesAndPadShortOnesWithoutLoss) {
  TokenSamples samples(write("{\"input_ids\": [1, 2, 3, 4, 5], \"loss_mask\": [0, 1, 1, 1, 1]}\n"
                             "{\"input_ids\": [6, 7], \"loss_mask\": [1, 1]}\n"),
                       10);
  const auto [ids, mask] = samples.rows(1, 3, 4);  // samples 1, 0, 1: wraps around
  EXPECT_TRUE(torch::equal(ids, torch::tensor({6, 7, 0, 0, 1, 2, 3, 4, 6, 7, 0, 0}).view({3, 4})));
  EXPECT_TRUE(torch::equal(mask, torch::tensor({1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0}).view({3, 4})));
}

TEST_F(TokenSamplesTest, BadLinesAreNamedWithFileAndLine) {
  const auto error_of_line_2 = [&](const std::string& line, std::vector<std::string> words) {
    const std::string path = write("{\"input_ids\": [1], \"loss_mask\": [1]}\n" + line + "\n");
    TokenSamples samples(path, 10);
    words.push_back(path + ":2");
    expect_error_mentioning([&] { samples.read(1); }, words);
  };
  error_of_line_2("{\"input_ids\": [1, 2]", {"invalid JSON"});
  error_of_line_2("[1, 2]", {"JSON object"});
  error_of_line_2("{\"input_ids\": [1, 2]}", {"missing key 'loss_mask'"});
  error_of_line_2("{\"input_ids\": [1, 2.5], \"loss_mask\": [1, 1]}", {"input_ids", "integers"});
  error_of_line_2("{\"input_ids\": [1, 2], \"loss_mask\": [1]}", {"2 tokens", "loss_mask 1"});
  error_of_line_2("{\"input_ids\": [1, 10], \"loss_mask\": [1, 1]}", {"input_ids[1] = 10", "[0, 10)"});
  error_of_line_2("{\"input_ids\": [1, 2], \"loss_mask\": [1, 2]}", {"loss_mask[1] = 2", "0 or 1"});
  error_of_line_2("{\"input_ids\": [], \"loss_mask\": []}", {"empty"});
}

TEST_F(TokenSamplesTest, MissingOrEmptyFileIsNamed) {
  expect_error_mentioning([&] { TokenSamples(path_.string(), 10); }, {path_.string(), "cannot open"});
  expect_error_mentioning([&] { TokenSamples(write("\n  \n"), 10); }, {path_.string(), "no samples"});
}

}  // namespace
}  // namespace dspine::data
