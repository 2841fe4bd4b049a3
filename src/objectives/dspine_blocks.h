// DSpine block construction (docs/model.md, "Anchors and blocks"): anchor sampling, labels, the
// cumulative supervision chain with decayed weights, replacement draws, position ids, block input
// ids, and the [M = B*N, T] layout the objective consumes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "objectives/row_streams.h"

namespace dspine::objectives {

// Explicit anchors [B, N] int64, keep [B, N] bool and replace [B, N] bool that override the
// sampling (dspine-eval, tests, blocks a decoding produced). Undefined fields are sampled as
// usual; keep defaults to all true when anchors are given. supervised_slots [B, N] int64 (with
// anchors; undefined: no limit): block n of row b supervises at most its first
// supervised_slots[b][n] proposals, e.g. a decoding round's accepted drafts and the slot after them
// (decode/decoded_blocks.h).
struct BlockOverrides {
  at::Tensor anchors, keep, replace, supervised_slots;
};

// [B, S-1] bool: position i can anchor a block iff loss_mask[i] > 0.5 and loss_mask[i+1] > 0.5.
at::Tensor valid_anchor_positions(const at::Tensor& loss_mask);

// Number of valid anchor positions of the fullest row, counted on the host (§5.2 step 2):
// i is valid iff loss_mask[i] > 0.5 and loss_mask[i+1] > 0.5.
int64_t max_valid_anchors(const at::Tensor& loss_mask);

struct AnchorSample {
  at::Tensor anchors;  // [B, N] int64 ascending valid positions, then zeros
  at::Tensor keep;     // [B, N] bool
};

// A uniform subset of min(count_b, N) valid positions per row, N = min(num_anchors,
// max_valid_anchors): row b's S-1 uniforms from its anchor stream, lowest first. A row's anchors
// depend on its own stream and mask alone, not on the rows beside it. Drawn on the host, where the
// uniforms are (a mask on the GPU is read first): anchors and keep are CPU tensors. Throws when no
// row has two consecutive supervised tokens.
AnchorSample sample_anchors(const at::Tensor& loss_mask, int64_t num_anchors,
                            const RowStreams& streams);

// (uniform [B, N] < probability) & keep, on the host, row b's uniforms the first N of the `draws`
// (>= N) of its replacement stream: `draws` fixed by the run (not by the batch), so that a row's
// mask does not depend on the N of the rows beside it.
at::Tensor draw_replacement(const at::Tensor& keep, double probability, const RowStreams& streams,
                            int64_t draws);

struct BlockLayout {
  at::Tensor anchors;       // [B, N] int64
  at::Tensor keep;          // [B, N] bool
  at::Tensor labels;        // [B, N, bs] int64 (slot 0 = anchor token)
  at::Tensor source_index;  // [B, N, bs] min(anchor + j, S-1)
  at::Tensor supervised;    // [B, N, T] bool, cumulative over slots 1..bs-1
  at::Tensor weights;       // [B, N, T] fp32, supervised * exp(-t/gamma) (gamma <= 0: no decay)
};

// supervised_slots [B, N] int64 (undefined: no limit) caps each block's supervised proposals.
BlockLayout layout_blocks(const at::Tensor& input_ids, const at::Tensor& loss_mask,
                          const at::Tensor& anchors, const at::Tensor& keep, int64_t block_size,
                          double gamma, const at::Tensor& supervised_slots = {});

// [B, S + N*bs]: 0..S-1 then anchor + 0..bs-1 per block (§5.5).
at::Tensor block_position_ids(const at::Tensor& anchors, int64_t seq_len, int64_t block_size);

// [B, N*bs]: mask_token_id everywhere except slot 0 of kept blocks = the anchor token (§5.7).
at::Tensor block_input_ids(const at::Tensor& input_ids, const at::Tensor& anchors,
                           const at::Tensor& keep, int64_t block_size, int64_t mask_token_id);

// The target position before each proposal's label, as a row of target_last_hidden_states
// viewed as [B·S, H]: [B, N, T] int64 (§5.9). Overlapping blocks share positions.
at::Tensor teacher_positions(const at::Tensor& source_index, int64_t seq_len);

}  // namespace dspine::objectives
