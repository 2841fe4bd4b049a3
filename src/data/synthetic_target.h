// A small seeded "target model": a Qwen3Model with random weights (Qwen3Model::random) whose
// logits are scaled by data.synthetic.logit_scale. It samples token sequences autoregressively
// (KV-cached decoding) and exposes the hidden states a draft model trains on.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/config.h"
#include "data/batch.h"
#include "target/qwen3_model.h"

namespace dspine::data {

class SyntheticTarget {
 public:
  // Dimensions: hidden_size / vocab_size / target_layer_ids from `model`, the rest from `target`.
  // Weights are a pure function of target.seed.
  SyntheticTarget(const core::ModelConfig& model, const core::SyntheticTargetConfig& target);

  // Sample number `index` (a pure function of seed and index): a sequence of `seq_len` tokens
  // drawn from the target itself, with a batch dimension of 1. Samples are decoded in groups of
  // kSampleGroup consecutive indices (one batched, KV-cached decode: per-token op overhead, not
  // arithmetic, is the cost at these sizes); sample i is row i % kSampleGroup of group
  // i / kSampleGroup, whoever asks and in whatever order. The last group is kept, and the next
  // one is decoded on a background thread meanwhile, so reading consecutive indices decodes each
  // group once, mostly while the trainer computes. Thread-safe.
  static constexpr int64_t kSampleGroup = 64;
  DraftBatch sample(int64_t index, int64_t seq_len) const;

  // Runs the target on given ids [B, S]: fills hidden_states and target_last_hidden_states.
  DraftBatch run(const at::Tensor& input_ids) const;

  // Next-token logits [B, S, V] (after logit_scale) for given ids; used by tests.
  at::Tensor logits(const at::Tensor& input_ids) const;

  const at::Tensor& embed_tokens() const { return parts_.target_model.embed_tokens(); }  // [V, H]
  const at::Tensor& lm_head() const { return parts_.lm_head; }  // [V, H], logit_scale folded in

 private:
  // What decoding reads. Copies share the tensors, so a background decode owns its own and
  // outlives nothing it needs.
  struct Parts {
    core::ModelConfig model;
    core::SyntheticTargetConfig target;
    target::Qwen3Model target_model;
    at::Tensor lm_head;
  };
  static DraftBatch run(const Parts& parts, const at::Tensor& input_ids);
  static std::vector<DraftBatch> decode_group(const Parts& parts, int64_t group, int64_t seq_len);

  struct GroupMemo {
    std::mutex mutex;
    int64_t group = -1, seq_len = 0;
    std::vector<DraftBatch> samples;
    int64_t next_group = -1, next_seq_len = 0;   // the group decoding in the background
    std::future<std::vector<DraftBatch>> next;  // its destructor waits for it
  };

  Parts parts_;
  std::unique_ptr<GroupMemo> memo_ = std::make_unique<GroupMemo>();  // the last group decoded
};

}  // namespace dspine::data
