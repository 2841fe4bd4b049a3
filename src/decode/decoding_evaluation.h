// τ in real decoding during training (training.eval_decode_tokens; docs/evaluation.md, "In
// decoding"): each held-out row's prompt is decoded greedily (or sampled) with the draft as it is
// now and the run's online target, beside the text τ of the same rows.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "data/batch.h"
#include "target/qwen3_model.h"
#include "dist/communicator.h"
#include "model/dspine_draft.h"

namespace dspine::decode {

struct DecodingEvaluationSettings {
  int64_t new_tokens = 0;     // generated per prompt (no stop token: every row runs to the limit)
  int64_t prompt_tokens = 0;  // a prompt is a row's first N ids; 0: its ids before the first
                              // supervised one (at least one)
  double temperature = 0.0;   // 0: greedy
  uint64_t seed = 0;          // the draws at temperature > 0
};

// Decodes the prompts of each batch's rows together with `draft` against `target` and returns
// decode_tau, decode_accept_<k> (k = 1..T) and decode_tokens, the counts summed over `comm`'s
// ranks. Every rank must call it, with its own rows; the draft's weights must be whole.
std::map<std::string, double> decoding_metrics(const target::Qwen3Model& target,
                                               model::DSpineDraft draft,
                                               const std::vector<data::DraftBatch>& batches,
                                               const DecodingEvaluationSettings& settings,
                                               dist::Communicator& comm);
inline constexpr const char* kDecodeTauMetric = "decode_tau";        // its keys that the trainer
inline constexpr const char* kDecodeTokensMetric = "decode_tokens";  // logs by name

}  // namespace dspine::decode
