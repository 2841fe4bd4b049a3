// The accumulation window (docs/model.md, "CE-only prepass and replay"): every micro-batch first
// runs a graph-free CE-only prepass, the window's [ΣCE, ΣD] is reduced once over ranks, then every
// micro-batch is replayed with grad. Its anchors and replacement draws come from streams keyed by
// step and global row (row_streams.h), so the replay draws the prepass's blocks again without any
// saved RNG state. Optionally the first micro-batch is deferred: no prepass runs for it, and its
// replay (the first) adds the prepassed micro-batches' [ΣCE, ΣD] to its own and makes the
// window's one reduction. WindowReplay is the bookkeeping.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "dist/communicator.h"

namespace dspine::objectives {

class WindowReplay {
 public:
  // Opens a window of `received` micro-batches for `expected` = accumulation_steps. Throws when
  // the window is short (the stream ended mid-window) or the previous one was not fully replayed.
  void begin(int64_t received, int64_t expected);
  // Appends micro-batch prepass results (in order).
  void record_prepass(double ce, double denominator);
  // Records the first micro-batch without a prepass.
  void record_deferred();
  // The window's only collective: all-reduce SUM of [ΣCE, ΣD]; requires ΣD > 0. Not for a window
  // with a deferred micro-batch (its replay reduces, then calls complete()).
  void reduce(dist::Communicator& comm);
  // Host fp64 [ΣCE, ΣD] of this rank's prepassed micro-batches.
  at::Tensor prepassed_totals() const;
  // The reduced window totals from the deferred micro-batch's replay; requires ΣD > 0.
  void complete(double global_ce, double global_denominator);
  // Whether micro-batch `index` is the deferred one, replayed before the window is reduced.
  bool deferred(int64_t index) const;
  // Starts the replay of micro-batch `index`; replays must come in order, after reduce() unless
  // `index` is deferred.
  void begin_replay(int64_t index) const;
  // Checks the replay drew the same blocks (its D equals the prepass D, unless deferred) and
  // counts it done.
  void finish_replay(int64_t index, double denominator);
  // For a non-replayed (immediate) micro-step: throws while replays are pending.
  void check_immediate() const;
  // Closes the window; throws unless every micro-batch was replayed.
  void end();

  bool active() const { return !prepasses_.empty(); }
  double alignment_ce() const { return global_ce_ / global_denominator_; }
  double global_denominator() const { return global_denominator_; }

 private:
  struct Prepass {
    double ce, denominator;
    bool deferred;  // no prepass ran: ce and denominator are 0
  };
  std::vector<Prepass> prepasses_;
  int64_t expected_ = 0;
  int64_t replayed_ = 0;
  bool reduced_ = false;
  double global_ce_ = 0, global_denominator_ = 0;
};

}  // namespace dspine::objectives
