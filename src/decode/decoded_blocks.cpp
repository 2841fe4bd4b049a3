#include "decode/decoded_blocks.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "decode/speculative_decoder.h"

namespace dspine::decode {

DecodedBlocks decoded_blocks(int64_t prompt_length, const DecodedRow& row, int64_t proposals) {
  const int64_t kept = std::accumulate(row.accepted.begin(), row.accepted.end(), int64_t{0});
  // The prefill chooses the first token; every verification keeps 1 .. proposals + 1 more.
  if (prompt_length < 1 || proposals < 1 || row.tokens.empty() ||
      kept + 1 != static_cast<int64_t>(row.tokens.size())) {
    fail(
        "decoded blocks: {} tokens after a prompt of {} cannot come from verifications that kept "
        "{} in all ({} proposals a block)",
        row.tokens.size(), prompt_length, kept, proposals);
  }
  DecodedBlocks blocks;
  int64_t anchor = prompt_length;  // the prefill's token, the first block's anchor
  for (const int64_t count : row.accepted) {
    if (count < 1 || count > proposals + 1) {
      fail("decoded blocks: a verification kept {} tokens, outside [1, {}]", count, proposals + 1);
    }
    blocks.anchors.push_back(anchor);
    blocks.supervised_slots.push_back(std::min(count, proposals));
    anchor += count;
  }
  return blocks;
}

}  // namespace dspine::decode
