#include "data/batch_source.h"

#include <torch/torch.h>

#include "core/error.h"
#include "data/random_source.h"
#include "data/shards.h"
#include "data/specforge_source.h"
#include "data/synthetic_target.h"
#include "data/target_source.h"

namespace dspine::data {
namespace {

// Sample i is SyntheticTarget::sample(i): the batch depends only on the cursor, never on how
// earlier batches were grouped or which rank asked.
class SyntheticSource : public BatchSource {
 public:
  explicit SyntheticSource(const core::Config& config)
      : target_(config.model, config.data.synthetic), seq_len_(config.data.seq_len) {}

  DraftBatch next(int64_t rows) override {
    if (rows < 1) fail("synthetic source: rows must be >= 1 (got {})", rows);
    // Rows are independent samples: one per thread, each computed serially inside the region.
    std::vector<DraftBatch> samples(static_cast<size_t>(rows));
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) samples[i] = target_.sample(cursor_ + i, seq_len_);
    });
    cursor_ += rows;
    return concat_rows(samples);
  }
  int64_t cursor() const override { return cursor_; }
  void seek(int64_t cursor) override {
    if (cursor < 0) fail("synthetic source: cursor must be >= 0 (got {})", cursor);
    cursor_ = cursor;
  }
  at::Tensor embed_tokens() const override { return target_.embed_tokens(); }
  at::Tensor lm_head() const override { return target_.lm_head(); }
  std::string describe() const override { return "the synthetic target"; }

 private:
  SyntheticTarget target_;
  int64_t seq_len_;
  int64_t cursor_ = 0;
};

}  // namespace

std::unique_ptr<BatchSource> make_batch_source(const core::Config& config,
                                               const c10::Device& device) {
  using core::DataSource;
  switch (config.data.source) {
    case DataSource::kSynthetic:
      return std::make_unique<SyntheticSource>(config);
    case DataSource::kRandom:
      return std::make_unique<RandomSource>(config, device);
    case DataSource::kShards:
      if (config.data.shards_dir.empty()) {
        fail("data.source is 'shards' but data.shards_dir is empty");
      }
      return std::make_unique<ShardReader>(config.data.shards_dir, layout_from_config(config));
    case DataSource::kTarget:
      return std::make_unique<TargetSource>(config, device);
    case DataSource::kSpecforge:
      return std::make_unique<SpecforgeSource>(config);
  }
  fail("data.source: unknown choice");
}

std::unique_ptr<BatchSource> make_held_out_source(const core::Config& config,
                                                  BatchSource& training) {
  const auto& data = config.data;
  if (!data.eval_samples_file.empty()) {
    return std::make_unique<TargetSource>(dynamic_cast<TargetSource&>(training),
                                          data.eval_samples_file);
  }
  if (!data.eval_specforge_dir.empty()) {
    return std::make_unique<SpecforgeSource>(dynamic_cast<SpecforgeSource&>(training),
                                             data.eval_specforge_dir);
  }
  if (data.eval_shards_dir.empty()) return nullptr;
  auto held_out = std::make_unique<ShardReader>(data.eval_shards_dir, layout_from_config(config));
  // Shards of another target would be judged against the wrong tables.
  if (!held_out->embed_tokens().equal(training.embed_tokens()) ||
      !held_out->lm_head().equal(training.lm_head())) {
    fail("data.eval_shards_dir {}: its target.safetensors differs from data.shards_dir {}'s: "
         "held-out shards must come from the training run's target",
         data.eval_shards_dir, data.shards_dir);
  }
  return held_out;
}

}  // namespace dspine::data
