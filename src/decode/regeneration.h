// The target's own continuations as training data (docs/decoding.md,
// "Regeneration"): each token sample's prompt is continued by the target alone
// (the decoding loop without a draft, batched, with its KV cache) and written
// as a token sample whose prompt is unsupervised and whose continuation is
// supervised, so that a draft trains on what the target itself says after the
// prompt, as SpecForge's regeneration step and vLLM's speculators do.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "target/qwen3_model.h"
#include "data/token_samples.h"
#include "decode/speculative_decoder.h"

namespace dspine::decode {

// A sample's prompt: its first `prompt_tokens` ids (when > 0), else the ids
// before its first supervised one (the whole sample when none is), at least
// one.
std::vector<int64_t> sample_prompt(const data::TokenSample& sample, int64_t prompt_tokens);

// The target's end-of-sequence ids: eos_token_id of its config.json (an id, a
// list, or none).
std::vector<int64_t> eos_token_ids(const std::string& target_dir);

// The bytes of weights one decoding forward of `dims` reads in `dtype`: every
// decoder layer's projections and norms, the final norm and the output head
// (the embedding rows read are few).
int64_t decode_weight_bytes(const target::Qwen3Dims& dims, at::ScalarType dtype);

struct RegenerationReport {
  int64_t samples = 0;
  int64_t prompt_tokens = 0;     // over all samples
  int64_t generated_tokens = 0;  // over all samples
  int64_t forwards = 0;          // batched target forwards, prefills included
  double seconds = 0;  // decoding alone (files and, on CUDA, the untimed warm-up batch left out)
};

// Samples first .. first + count - 1 of `samples`, their prompts continued by
// `target` in batches of `batch` under `settings`, written to `out_path` (a new
// file, written whole under a temporary name and then renamed) as JSONL token
// samples.
RegenerationReport regenerate(const target::Qwen3Model& target, data::TokenSamples& samples,
                              int64_t first, int64_t count, int64_t prompt_tokens, int64_t batch,
                              const DecodeSettings& settings, const std::string& out_path);

}  // namespace dspine::decode
