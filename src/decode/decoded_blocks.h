// Where a decoded row's rounds put their blocks (docs/decoding.md, "Training on the draft's own
// decoding"): training at the block starts the draft's own decoding produced, on the target's own
// tokens, supervises in each block the drafts the target accepted and the slot after them (where
// the target's own token replaced the first rejected draft).
#pragma once

#include <cstdint>
#include <vector>

namespace dspine::decode {

struct DecodedRow;  // decode/speculative_decoder.h

struct DecodedBlocks {
  // Position of each round's anchor in prompt ++ tokens (the token the round's block followed:
  // the prefill's choice, then the last token each verification kept), one per verification.
  std::vector<int64_t> anchors;
  // Each block's supervised proposals: the verification's kept tokens (accepted drafts + the
  // target's own), at most `proposals` (a wholly accepted block ends at its last draft).
  std::vector<int64_t> supervised_slots;
};

// The blocks of `row` decoded after a prompt of `prompt_length` tokens with `proposals` drafts a
// block. Throws when the row's counts do not fit its tokens.
DecodedBlocks decoded_blocks(int64_t prompt_length, const DecodedRow& row, int64_t proposals);

}  // namespace dspine::decode
