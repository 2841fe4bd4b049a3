// The random draws of the objectives (anchors, replacement masks, GSPO rollout samples), keyed by
// (seed, optimizer step, global row) instead of by rank: a row draws the same values whichever
// rank and micro-batch it lands in, so `mpirun -np N` at batch B samples what one process samples
// at batch N·B, and a resumed run needs no saved generator state. Each draw is a fresh CPU
// generator (mt19937) seeded from core::stream_seed(stream_seed(stream_seed(seed, step), row),
// kind) through core::generator_seed; a row's draws of one kind are always a prefix of the same
// stream, and the kinds never share one (docs/model.md, "Random draws").
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>

namespace dspine::objectives {

// Which of a row's streams a draw reads.
enum class RowDraw : uint64_t { kAnchors = 0, kReplacement = 1, kRollout = 2 };

// The streams of one batch's rows: row r of the batch is global row first_row + r.
struct RowStreams {
  uint64_t seed = 0;      // training.seed
  int64_t step = 0;       // the optimizer step the draws belong to (0-based)
  int64_t first_row = 0;  // global row of the batch's row 0

  // The generator of global row first_row + `row` for draws of `kind`, at its start.
  at::Generator generator(int64_t row, RowDraw kind) const;
  // [rows, count] uniforms in [0, 1) of `dtype` on the CPU: row r holds the first `count` draws of
  // its stream of `kind`.
  at::Tensor uniform(RowDraw kind, int64_t rows, int64_t count,
                     c10::ScalarType dtype = c10::kFloat) const;
  // counts[r] draws of each row's stream of `kind`, concatenated in row order ([Σ counts], CPU).
  at::Tensor uniform(RowDraw kind, const at::Tensor& counts, c10::ScalarType dtype) const;
  // The streams of rows begin.. of this batch, as a batch of their own.
  RowStreams rows_from(int64_t begin) const { return {seed, step, first_row + begin}; }
};

}  // namespace dspine::objectives
