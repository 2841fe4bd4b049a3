// The accumulation window (docs/model.md, "CE-only prepass and replay"): every micro-batch first
// runs a graph-free CE-only prepass (RNG state saved just before it), the window's [ΣCE, ΣD] is
// reduced once over ranks, then every micro-batch is replayed with grad under the RNG state its
// prepass had, so anchors and replacement draws are identical. Optionally the first micro-batch
// is deferred: only its RNG state is recorded, and its replay (the first) adds the prepassed
// micro-batches' [ΣCE, ΣD] to its own and makes the window's one reduction. WindowReplay is the
// bookkeeping; GeneratorFork the RNG part.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "dist/communicator.h"

namespace dspine::objectives {

// A copy of the generator's state.
at::Tensor generator_state(at::Generator& generator);

// Sets `generator` to `state` for its lifetime, then restores the state it had before.
class GeneratorFork {
 public:
  GeneratorFork(at::Generator& generator, const at::Tensor& state);
  ~GeneratorFork();
  GeneratorFork(const GeneratorFork&) = delete;
  GeneratorFork& operator=(const GeneratorFork&) = delete;

 private:
  at::Generator& generator_;
  at::Tensor saved_;
};

class WindowReplay {
 public:
  // Opens a window of `received` micro-batches for `expected` = accumulation_steps. Throws when
  // the window is short (the stream ended mid-window) or the previous one was not fully replayed.
  void begin(int64_t received, int64_t expected);
  // Appends micro-batch prepass results (in order) with the RNG state from just before it.
  void record_prepass(at::Tensor rng_state, double ce, double denominator);
  // Records the first micro-batch without a prepass: only the RNG state from before its draws.
  void record_deferred(at::Tensor rng_state);
  // The window's only collective: all-reduce SUM of [ΣCE, ΣD]; requires ΣD > 0. Not for a window
  // with a deferred micro-batch (its replay reduces, then calls complete()).
  void reduce(dist::Communicator& comm);
  // Host fp64 [ΣCE, ΣD] of this rank's prepassed micro-batches.
  at::Tensor prepassed_totals() const;
  // The reduced window totals from the deferred micro-batch's replay; requires ΣD > 0.
  void complete(double global_ce, double global_denominator);
  // Whether micro-batch `index` is the deferred one, replayed before the window is reduced.
  bool deferred(int64_t index) const;
  // RNG state for replaying micro-batch `index`; replays must come in order, after reduce()
  // unless `index` is deferred.
  const at::Tensor& replay_state(int64_t index);
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
    at::Tensor rng_state;
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
