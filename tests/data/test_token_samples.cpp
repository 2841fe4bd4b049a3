#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>
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

// The bad lines every check must refuse, with words its message must hold.
const std::vector<std::pair<std::string, std::vector<std::string>>> kBadLines = {
    {"{\"input_ids\": [1, 2]", {"invalid JSON"}},
    {"{\"input_ids\": [1, 2], \"loss_mask\": [1, 1]} x", {"invalid JSON"}},
    {"[1, 2]", {"JSON object"}},
    {"{\"input_ids\": [1, 2]}", {"missing key 'loss_mask'"}},
    {"{\"loss_mask\": [1, 2]}", {"missing key 'input_ids'"}},
    {"{\"input_ids\": [1, 2.5], \"loss_mask\": [1, 1]}", {"input_ids", "integers"}},
    {"{\"input_ids\": [1, [2]], \"loss_mask\": [1, 1]}", {"input_ids", "integers"}},
    {"{\"input_ids\": 1, \"loss_mask\": [1]}", {"input_ids", "integers"}},
    {"{\"input_ids\": [1, 9223372036854775808], \"loss_mask\": [1, 1]}", {"input_ids", "integers"}},
    {"{\"input_ids\": [1, 2], \"loss_mask\": [1, true]}", {"loss_mask", "integers"}},
    {"{\"input_ids\": [1, 2], \"loss_mask\": [1]}", {"2 tokens", "loss_mask 1"}},
    {"{\"input_ids\": [1, 10], \"loss_mask\": [1, 1]}", {"input_ids[1] = 10", "[0, 10)"}},
    {"{\"input_ids\": [1, -1], \"loss_mask\": [1, 1]}", {"input_ids[1] = -1", "[0, 10)"}},
    {"{\"input_ids\": [1, 2], \"loss_mask\": [1, 2]}", {"loss_mask[1] = 2", "0 or 1"}},
    {"{\"input_ids\": [], \"loss_mask\": []}", {"empty"}},
};

// 99 good lines (line 50 blank, so line and sample numbers differ), then `line_100`.
std::string with_line_100(const std::string& line_100) {
  std::string text;
  for (int line = 1; line < 100; ++line) {
    text += line == 50 ? "\n"
                       : fmt::format("{{\"input_ids\": [{}, 3], \"loss_mask\": [0, 1]}}\n",
                                     line % 10);
  }
  return text + line_100 + "\n";
}

TEST_F(TokenSamplesTest, BadLine100StopsTheConstructorNamingFileAndLine) {
  for (auto [line, words] : kBadLines) {
    SCOPED_TRACE(line);
    const std::string path = write(with_line_100(line));
    words.push_back(path + ":100");
    expect_error_mentioning([&] { TokenSamples(path, 10); }, words);
  }
  const std::string good = with_line_100("{\"input_ids\": [9], \"loss_mask\": [1]}");
  EXPECT_EQ(TokenSamples(write(good), 10).size(), 99);
  // Lines are checked on several threads; the first bad line is the one named.
  std::string text = with_line_100("{\"input_ids\": [1, 2], \"loss_mask\": [1]}");
  for (int line = 101; line <= 200; ++line) {
    text += line == 190 ? "[]\n" : "{\"input_ids\": [1], \"loss_mask\": [1]}\n";
  }
  expect_error_mentioning([&] { TokenSamples(write(text), 10); }, {path_.string() + ":100:"});
}

TEST_F(TokenSamplesTest, ReadChecksALineWithTheSameRules) {
  // Line 2 is changed after indexing (same length, so the index still points at it).
  const std::string good = "{\"input_ids\": [1, 2], \"loss_mask\": [1, 1]}";
  const std::string path = write("{\"input_ids\": [1], \"loss_mask\": [1]}\n" + good + "\n");
  TokenSamples samples(path, 10);
  write("{\"input_ids\": [1], \"loss_mask\": [1]}\n"
        "{\"input_ids\": [1, 2], \"loss_mask\": [1, 2]}\n");
  expect_error_mentioning([&] { samples.read(1); }, {path + ":2", "loss_mask[1] = 2", "0 or 1"});
}

TEST_F(TokenSamplesTest, LinesAcrossReadBlocksAndLongerThanABlockAreIndexed) {
  // About 18 MB: lines cross the boundaries of the 8 MB blocks the constructor reads, and one
  // line of 12 MB is longer than a block.
  const auto line = [](int64_t first, int64_t length) {
    std::string ids, mask;
    for (int64_t t = 0; t < length; ++t) {
      ids += fmt::format("{}{}", t ? ", " : "", (first + t) % 10);
      mask += t ? ", 1" : "0";
    }
    return fmt::format("{{\"input_ids\": [{}], \"loss_mask\": [{}]}}", ids, mask);
  };
  std::string text;
  for (int64_t i = 0; i < 1000; ++i) text += line(i, 500 + i % 7) + "\n";
  text += line(7, 2'000'000) + "\n";
  for (int64_t i = 1001; i < 2000; ++i) text += line(i, 500 + i % 7) + "\r\n";
  text += line(3, 4);  // no final newline
  TokenSamples samples(write(text), 10);
  ASSERT_EQ(samples.size(), 2001);
  for (int64_t i : {0, 999, 1001, 1500, 1999}) {
    const TokenSample sample = samples.read(i);
    ASSERT_EQ(static_cast<int64_t>(sample.input_ids.size()), 500 + i % 7) << i;
    EXPECT_EQ(sample.input_ids[1], (i + 1) % 10) << i;
    EXPECT_EQ(sample.loss_mask[0], 0) << i;
  }
  const TokenSample long_line = samples.read(1000);
  ASSERT_EQ(long_line.input_ids.size(), 2'000'000u);
  EXPECT_EQ(long_line.input_ids.back(), (7 + 1'999'999) % 10);
  EXPECT_EQ(samples.read(2000).input_ids, (std::vector<int64_t>{3, 4, 5, 6}));
}

// An unopenable file is named with the key it came from and the OS reason.
TEST_F(TokenSamplesTest, MissingOrEmptyFileIsNamed) {
  expect_error_mentioning([&] { TokenSamples(path_.string(), 10); }, {path_.string(), "cannot open"});
  expect_error_mentioning([&] { TokenSamples(path_.string(), 10, "data.eval_samples_file"); },
                          {path_.string(), "cannot open the token samples file "
                                           "(data.eval_samples_file): No such file or directory"});
  expect_error_mentioning([&] { TokenSamples(write("\n  \n"), 10); }, {path_.string(), "no samples"});
}

}  // namespace
}  // namespace dspine::data
