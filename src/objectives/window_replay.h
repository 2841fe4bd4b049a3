// The accumulation window (docs/model.md, "CE-only prepass and replay"): every micro-batch first
// runs a graph-free CE-only prepass, the window's [ΣCE, ΣD] is reduced once over ranks, then every
// micro-batch is replayed with grad. Its anchors and replacement draws come from streams keyed by
// step and global row (row_streams.h), so the replay draws the prepass's blocks again without any
// saved RNG state. Optionally the first micro-batch is deferred: no prepass runs for it, and its
// replay (the first) adds the prepassed micro-batches' [ΣCE, ΣD] to its own and makes the
// window's one reduction. WindowReplay is the bookkeeping.
//
// The window's values stay tensors where they were computed (fp64 scalars, on the GPU in
// training) and are read once, by end(): reading one between a replay's forward and its backward
// would empty the GPU's queue (docs/model.md, "The host stays ahead"). The order of calls is
// checked at once, and so are values on the host (where reading costs nothing); the checks of
// values on the GPU (ΣD > 0, each replay's D equal to its prepass D) come with end()'s read.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "dist/communicator.h"

namespace dspine::objectives {

// Fails unless the window (or batch) has supervised proposal tokens over all ranks.
void check_supervised(double global_denominator);

class WindowReplay {
 public:
  // Opens a window of `received` micro-batches for `expected` = accumulation_steps. Throws when
  // the window is short (the stream ended mid-window) or the previous one was not fully replayed.
  void begin(int64_t received, int64_t expected);
  // Appends a micro-batch's prepass CE and D (scalars, in order).
  void record_prepass(const at::Tensor& ce, const at::Tensor& denominator);
  // Records the first micro-batch without a prepass.
  void record_deferred();
  // fp64 [ΣCE, ΣD] of this rank's prepassed micro-batches, on their device ([0, 0] on the host
  // when there are none).
  at::Tensor prepassed_totals() const;
  // The window's only collective: all-reduce SUM of [ΣCE, ΣD], on the device where `comm` takes
  // device tensors. Not for a window with a deferred micro-batch (its replay reduces, then calls
  // complete()).
  void reduce(dist::Communicator& comm);
  // The reduced window totals (fp64 scalars) from the deferred micro-batch's replay.
  void complete(const at::Tensor& global_ce, const at::Tensor& global_denominator);
  // Whether micro-batch `index` is the deferred one, replayed before the window is reduced.
  bool deferred(int64_t index) const;
  // Starts the replay of micro-batch `index`; replays must come in order, after reduce() unless
  // `index` is deferred.
  void begin_replay(int64_t index) const;
  // Counts micro-batch `index`'s replay done; end() checks it drew the prepass's blocks (its D
  // equals the prepass D, unless deferred).
  void finish_replay(int64_t index, const at::Tensor& denominator);
  // For a non-replayed (immediate) micro-step: throws while replays are pending.
  void check_immediate() const;
  // Reads the window's values (one transfer), checks them and closes the window; throws unless
  // every micro-batch was replayed.
  void end();

  bool active() const { return !prepasses_.empty(); }
  // CE̅ = ΣCE / ΣD and ΣD of the reduced window: fp64 scalars where they were reduced.
  at::Tensor alignment_ce() const;
  const at::Tensor& global_denominator() const { return global_denominator_; }

 private:
  struct Prepass {
    at::Tensor ce, denominator;  // undefined when deferred (no prepass ran)
    at::Tensor replayed;         // the replay's D, once finished
  };
  std::vector<Prepass> prepasses_;
  int64_t expected_ = 0;
  int64_t replayed_ = 0;
  bool reduced_ = false;
  at::Tensor global_ce_, global_denominator_;
};

}  // namespace dspine::objectives
