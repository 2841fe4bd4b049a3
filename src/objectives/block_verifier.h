// Who verifies drafted blocks: the acceptance evaluation and the GSPO rewards both ask it what the
// target puts at every slot of a drafted block. docs/evaluation.md ("Who verifies") and
// docs/gspo.md ("Rewards") describe the choices.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "core/settings.h"
#include "data/batch.h"
#include "data/batch_source.h"
#include "target/qwen3_model.h"
#include "objectives/dspine_forward.h"

namespace dspine::objectives {

// The answer for drafted blocks tokens [K, G, T]: G candidate blocks for each of the K kept anchor
// blocks. Slot j of a block is accepted while every drafted token before it was accepted and
// its own token equals choices[..., j].
struct BlockVerdict {
  at::Tensor choices;      // [K, G, T] int64: the target's token at each slot
  at::Tensor token_probs;  // [K, G, T] fp32: its probability of the drafted token (when asked)
};

class BlockVerifier {
 public:
  virtual ~BlockVerifier() = default;
  virtual std::string name() const = 0;
  // Whether verify() reads the teacher states of a full-rows draft pass.
  virtual bool needs_teacher_states() const { return false; }
  // Drafted `tokens` [K, G, T] of the kept blocks `kept` [K] (indices among the pass's B·N
  // blocks) of `pass` over `batch`; token_probs only `with_probs`.
  virtual BlockVerdict verify(const data::DraftBatch& batch, const DraftPass& pass,
                              const at::Tensor& kept, const at::Tensor& tokens,
                              bool with_probs) const = 0;
};

// "data": the sample's own next tokens, whatever was drafted; probability 1 on them, 0 elsewhere.
class DataVerifier final : public BlockVerifier {
 public:
  std::string name() const override { return "data"; }
  BlockVerdict verify(const data::DraftBatch& batch, const DraftPass& pass, const at::Tensor& kept,
                      const at::Tensor& tokens, bool with_probs) const override;
};

// "teacher": the target's states stored with the data (its final states through lm_head): its
// greedy token and distribution after the data's prefix (teacher forcing), whatever was drafted.
// What a run without an online target knows of the target. Each distinct target position's
// logits once, in chunks of `chunk_blocks` blocks' worth of rows.
class TeacherVerifier final : public BlockVerifier {
 public:
  TeacherVerifier(at::Tensor lm_head, int64_t chunk_blocks)
      : lm_head_(std::move(lm_head)), chunk_blocks_(chunk_blocks) {}
  std::string name() const override { return "teacher"; }
  bool needs_teacher_states() const override { return true; }
  BlockVerdict verify(const data::DraftBatch& batch, const DraftPass& pass, const at::Tensor& kept,
                      const at::Tensor& tokens, bool with_probs) const override;

 private:
  at::Tensor lm_head_;
  int64_t chunk_blocks_;
};

// "online target": verification as in speculative decoding, the target's answer after the context
// up to the anchor followed by the block's own drafted prefix. One cached target pass over each
// sample gives slot 0 (the anchor's own next token) and the keys and values of the context; the
// drafted tokens then run as branches of that cache (Qwen3Model::branch), so a block costs its
// T − 1 drafted tokens, not a pass over its context.
class TargetVerifier final : public BlockVerifier {
 public:
  explicit TargetVerifier(const target::Qwen3Model& target) : target_(target) {}
  std::string name() const override { return "online target"; }
  BlockVerdict verify(const data::DraftBatch& batch, const DraftPass& pass, const at::Tensor& kept,
                      const at::Tensor& tokens, bool with_probs) const override;

 private:
  const target::Qwen3Model& target_;
};

// The reference of TargetVerifier: one full target forward over context + block for every block,
// in chunks of `chunk_blocks` right-padded sequences (causal attention keeps the padding out of
// every real position). The plain definition, for tests.
class PerBlockTargetVerifier final : public BlockVerifier {
 public:
  explicit PerBlockTargetVerifier(const target::Qwen3Model& target, int64_t chunk_blocks = 64)
      : target_(target), chunk_blocks_(chunk_blocks) {}
  std::string name() const override { return "online target"; }
  BlockVerdict verify(const data::DraftBatch& batch, const DraftPass& pass, const at::Tensor& kept,
                      const at::Tensor& tokens, bool with_probs) const override;

 private:
  const target::Qwen3Model& target_;
  int64_t chunk_blocks_;
};

// The acceptance evaluation's verifier: the source's online target when it runs one, else the
// data.
std::unique_ptr<BlockVerifier> make_verifier(const data::BatchSource& source);

// Where GSPO's rewards come from (objective.gspo.reward_source).
enum class RewardSource {
  kTarget,  // the online target when the run has one, else the target's states in the data
  kData,    // the data's tokens
};
constexpr std::array<core::Choice<RewardSource>, 2> choices_of(RewardSource) {
  return {{{RewardSource::kTarget, "target"}, {RewardSource::kData, "data"}}};
}

// The GSPO rewards' verifier: `online_target` may be null; lm_head and chunk_blocks serve the
// teacher verifier.
std::unique_ptr<BlockVerifier> make_reward_verifier(RewardSource source,
                                                    const target::Qwen3Model* online_target,
                                                    const at::Tensor& lm_head,
                                                    int64_t chunk_blocks);

}  // namespace dspine::objectives
