// Which rows the acceptance evaluation measures (data/held_out.h): the default rows of a finite
// training set are rows the run never reads, or the run is refused; rows the user picks are
// measured and reported as trained on; a separate held-out source is never trained on.
#include <gtest/gtest.h>

#include "common/expect_error.h"
#include "core/config.h"
#include "data/batch_source.h"
#include "data/held_out.h"

namespace {

using dspine::data::held_out_rows;
using dspine::testing::expect_error_mentioning;

// A source of `distinct` samples (0: unbounded); only its size and name matter here.
class SizedSource : public dspine::data::BatchSource {
 public:
  SizedSource(int64_t distinct, std::string name) : distinct_(distinct), name_(std::move(name)) {}
  dspine::data::DraftBatch next(int64_t) override { return {}; }
  int64_t cursor() const override { return 0; }
  void seek(int64_t) override {}
  at::Tensor embed_tokens() const override { return {}; }
  at::Tensor lm_head() const override { return {}; }
  int64_t distinct_samples() const override { return distinct_; }
  std::string describe() const override { return name_; }

 private:
  int64_t distinct_;
  std::string name_;
};

// The case: 160 samples, 30 steps x batch 16 read 480 of them (every row, three times).
dspine::core::Config run_of_480_rows() {
  auto config = dspine::core::parse_config("data: {source: target, target: {path: t}, samples: s}",
                                           "test");
  config.training.total_steps = 30;
  config.training.batch_size = 16;
  config.data.eval_samples = 32;
  return config;
}

TEST(HeldOut, DefaultRowsPastAFiniteSetThatWasReadWholeAreRefused) {
  const auto config = run_of_480_rows();
  const SizedSource training(160, "token samples train.jsonl");
  const int64_t trained = dspine::core::training_rows(config, 1);
  ASSERT_EQ(trained, 480);
  const auto rows = held_out_rows(training, nullptr, trained,
                                  dspine::core::eval_offset(config, 1), 32);
  EXPECT_EQ(rows.offset, 480);
  EXPECT_EQ(rows.trained_on, 32);  // 480..511 wrap onto rows 0..31
  EXPECT_NE(rows.describe().find("NOT held out"), std::string::npos) << rows.describe();
  expect_error_mentioning([&] { dspine::data::require_unread(rows, config); },
                          {"no held-out rows", "token samples train.jsonl holds 160 samples",
                           "read 480", "leaving 0 never read", "data.eval_samples = 32",
                           "data.eval_samples_file"});
}

TEST(HeldOut, DefaultRowsInsideAFiniteSetAreTheUnreadTail) {
  auto config = run_of_480_rows();
  config.training.total_steps = 8;  // 128 of 160 rows read: 32 left, exactly enough
  const SizedSource training(160, "token samples train.jsonl");
  const auto rows = held_out_rows(training, nullptr, dspine::core::training_rows(config, 1),
                                  dspine::core::eval_offset(config, 1), 32);
  EXPECT_EQ(rows.offset, 128);
  EXPECT_EQ(rows.trained_on, 0);
  EXPECT_NO_THROW(dspine::data::require_unread(rows, config));
  // One sample more wraps onto row 0.
  const auto over = held_out_rows(training, nullptr, 128, 128, 33);
  EXPECT_EQ(over.trained_on, 1);
  expect_error_mentioning([&] { dspine::data::require_unread(over, config); },
                          {"leaving 32 never read, fewer than data.eval_samples"});
  // Two ranks read twice the rows: none left.
  EXPECT_EQ(dspine::core::training_rows(config, 2), 256);
}

TEST(HeldOut, ChosenRowsAreMeasuredAndCountedWhenTrainedOn) {
  const SizedSource training(160, "token samples train.jsonl");
  // Rows 100..131 of a run that read 120: the first 20 were trained on.
  const auto rows = held_out_rows(training, nullptr, 120, 100, 32);
  EXPECT_EQ(rows.trained_on, 20);
  EXPECT_NE(rows.describe().find("20 of them among the 120 the run trains on"), std::string::npos)
      << rows.describe();
}

TEST(HeldOut, UnboundedSourcesAreHeldOutPastTheTrainingRows) {
  const SizedSource training(0, "the synthetic target");
  EXPECT_EQ(held_out_rows(training, nullptr, 480, 480, 64).trained_on, 0);
  const auto overlapping = held_out_rows(training, nullptr, 480, 470, 64);
  EXPECT_EQ(overlapping.trained_on, 10);
  // An endless source has no separate held-out set: the refusal says how far to move the rows.
  expect_error_mentioning(
      [&] { dspine::data::require_unread(overlapping, dspine::core::Config{}); },
      {"10 of the samples 470..533 of the synthetic target are among the 480 the run trains on",
       "Set data.eval_offset to at least 480"});
}

TEST(HeldOut, ASeparateSourceStartsAtZeroAndIsNeverTrainedOn) {
  auto config = run_of_480_rows();
  config.data.eval_samples_file = "held_out.jsonl";
  EXPECT_EQ(dspine::core::eval_offset(config, 4), 0);
  const SizedSource training(160, "token samples train.jsonl");
  const SizedSource held_out(40, "token samples held_out.jsonl");
  const auto rows = held_out_rows(training, &held_out, 480, 0, 32);
  EXPECT_TRUE(rows.separate);
  EXPECT_EQ(rows.trained_on, 0);
  EXPECT_NO_THROW(dspine::data::require_unread(rows, config));
  EXPECT_NE(rows.describe().find("samples 0..31 of token samples held_out.jsonl"),
            std::string::npos)
      << rows.describe();
}

}  // namespace
