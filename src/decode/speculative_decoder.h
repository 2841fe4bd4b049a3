// Speculative decoding of a Qwen3 target with a DSpine draft, batched (docs/decoding.md). The
// target prefills each prompt into its KV cache; then, per round, the draft proposes a block from
// the target's hidden states of everything accepted so far, the target verifies the block in one
// forward against its cache (verification.h's rules), and each row keeps its accepted tokens plus
// one of the target's own. Rows accept different numbers of tokens, so each keeps its own cache
// length (target::Qwen3Model::step_rows). Without a draft the same code decodes the target alone,
// one token per forward: the baseline of the speedup, and the reference of the lossless tests. On
// CUDA a round's work is captured as a CUDA graph once and replayed (round_graph.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "target/qwen3_model.h"
#include "decode/block_drafter.h"

namespace dspine::decode {

struct DecodeSettings {
  int64_t max_new_tokens = 128;
  double temperature = 0.0;          // 0: greedy
  uint64_t seed = 0;                 // the draws at temperature > 0
  std::vector<int64_t> stop_tokens;  // a row ends after generating one of these (EOS)
  // On CUDA, a round runs as a CUDA graph, captured once and replayed (docs/decoding.md): the
  // same tokens as eager rounds, without launching every kernel from the host.
  bool cuda_graphs = true;
};

struct DecodedRow {
  std::vector<int64_t> tokens;    // generated ids, the stop token included when one ended the row
  std::vector<int64_t> accepted;  // tokens each verification gave the row (accepted drafts + 1)
};

struct DecodeResult {
  std::vector<DecodedRow> rows;
  int64_t verifications = 0;  // target forwards after the prefill, summed over rows
  int64_t generated = 0;      // tokens those verifications produced (the prefill's first excluded)
  int64_t rounds = 0;         // rounds of the whole batch (one target forward each)
  // accepted_by_position[k]: verifications whose first k + 1 drafted tokens were all accepted
  std::vector<int64_t> accepted_by_position;
  // wall time of decode(), prefill included (and the capture, in the first call of a batch
  // shape), device synchronised
  double seconds = 0;
  bool cuda_graphs = false;  // whether the rounds ran as a CUDA graph

  double tau() const;  // generated / verifications: tokens per target forward
};

class SpeculativeDecoder {
 public:
  // drafter null: the target alone. Both must live on the same device.
  SpeculativeDecoder(const target::Qwen3Model& target, Drafter* drafter, DecodeSettings settings);
  ~SpeculativeDecoder();

  // Every prompt (token ids, at least one) decoded together as one batch. Calls of the same batch
  // size and similar lengths share their buffers and the captured round.
  DecodeResult decode(const std::vector<std::vector<int64_t>>& prompts);

 private:
  class Session;
  const target::Qwen3Model& target_;
  Drafter* drafter_;
  DecodeSettings settings_;
  std::unique_ptr<Session> session_;  // the last call's
};

}  // namespace dspine::decode
