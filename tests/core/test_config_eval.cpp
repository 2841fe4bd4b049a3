// The acceptance evaluation's keys (training.eval_every, data.eval_samples, data.eval_offset,
// data.eval_samples_file / eval_shards_dir / eval_specforge_dir): defaults, range errors naming
// key and value, "did you mean", and the resolved first sample.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/config.h"
#include "core/error.h"

namespace dspine::core {
namespace {

std::string parse_error(const std::vector<std::string>& overrides) {
  try {
    parse_config("", "test.yaml", overrides);  // the simple draft: eval_every stays 0
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << text;
}

TEST(ConfigEval, DefaultsAreOffWithSamplesPastTheTrainingData) {
  const Config c = parse_config("", "test.yaml");
  EXPECT_EQ(c.training.eval_every, 0);
  EXPECT_EQ(c.data.eval_samples, 64);
  EXPECT_EQ(c.data.eval_offset, -1);
}

TEST(ConfigEval, OffsetDefaultsToTheFirstSampleNotTrainedOn) {
  Config c = parse_config("training: {batch_size: 3, accumulation_steps: 2, total_steps: 10}\n",
                          "test.yaml");
  EXPECT_EQ(eval_offset(c, 1), 60);
  EXPECT_EQ(eval_offset(c, 4), 240);
  c.data.eval_offset = 7;
  EXPECT_EQ(eval_offset(c, 4), 7);
}

TEST(ConfigEval, ASeparateHeldOutSetIsReadFromItsFirstSample) {
  Config c = parse_config("data: {source: target, target: {path: t}, samples: train.jsonl, "
                          "eval_samples_file: held_out.jsonl}\n"
                          "training: {batch_size: 3, total_steps: 10}\n",
                          "test.yaml");
  EXPECT_EQ(c.data.eval_samples_file, "held_out.jsonl");
  EXPECT_EQ(eval_offset(c, 2), 0);
  EXPECT_EQ(training_rows(c, 2), 60);
  c.data.eval_offset = 7;
  EXPECT_EQ(eval_offset(c, 2), 7);
  EXPECT_EQ(parse_config("data: {source: shards, shards_dir: a, eval_shards_dir: b}\n",
                         "test.yaml").data.eval_shards_dir,
            "b");
}

TEST(ConfigEval, AHeldOutSetOfAnotherSourceIsAnError) {
  expect_contains(parse_error({"data.eval_samples_file=held_out.jsonl"}),
                  "data.eval_samples_file = \"held_out.jsonl\": data.source is synthetic; this "
                  "key is for data.source target");
  expect_contains(parse_error({"data.eval_shards_dir=held_out"}),
                  "data.eval_shards_dir = \"held_out\": data.source is synthetic; this key is for "
                  "data.source shards");
  expect_contains(parse_error({"data.eval_specforge_dir=held_out"}),
                  "this key is for data.source specforge");
}

TEST(ConfigEval, RangeErrorsNameKeyAndValue) {
  expect_contains(parse_error({"training.eval_every=-1"}),
                  "training.eval_every = -1 is out of range");
  expect_contains(parse_error({"data.eval_samples=0"}), "data.eval_samples = 0 is out of range");
  expect_contains(parse_error({"data.eval_offset=-2"}),
                  "data.eval_offset = -2 is out of range; allowed: integer >= 0, or -1 for the "
                  "first sample past the training data");
  expect_contains(parse_error({"data.eval_samples=many"}),
                  "data.eval_samples = many: expected an integer");
}

TEST(ConfigEval, MisspelledKeysGetDidYouMean) {
  expect_contains(parse_error({"training.eval_evry=5"}), "did you mean training.eval_every?");
  expect_contains(parse_error({"data.eval_sample=5"}), "did you mean data.eval_samples?");
}

}  // namespace
}  // namespace dspine::core
