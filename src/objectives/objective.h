// The contract between the trainer and a training objective. The trainer drives optimizer
// windows of `accumulation_steps` micro-batches: begin_window sees every micro-batch first
// (global normalizers, CE-only prepass), then micro_step runs each micro-batch with autograd and
// the trainer calls backward on the returned loss. Each micro-batch loss is already its share of
// the window's *global* loss (divided by the global normalizer), so the window gradient is the
// plain sum over micro-batches and ranks: data-parallel ranks all-reduce gradients with SUM.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/error.h"
#include "data/batch.h"
#include "dist/communicator.h"
#include "objectives/row_streams.h"

namespace dspine::objectives {

// Metric keys an objective reports and the trainer (or the step benchmark) reads back.
// Seconds of the window spent in the GSPO seam (the trainer adds time/seam_share from it).
inline constexpr const char* kSeamSecondsMetric = "time/seam_s";

// Thrown alike on every rank by begin_window when the window cannot be trained and nothing of the
// run's state has changed yet (a rollout that drew a token outside the vocabulary): the trainer
// saves the state before the step and stops with this message, as it does when data fails.
class WindowFailure : public Error {
 public:
  using Error::Error;
};

struct StepContext {
  int64_t step = 0;         // optimizer step this window belongs to (0-based)
  int64_t total_steps = 1;  // optimizer-step horizon (schedules such as DSpine replacement)
  int64_t update = 0;       // which of the window's updates_per_window() updates is running
  dist::Communicator* comm = nullptr;  // never null; collectives for global normalizers
  // Sampling inside the objective (anchors, replacement, rollouts) draws from streams keyed by
  // (seed, step, global row) (row_streams.h). The global row of row r of micro-batch i on this
  // rank is i·row_stride + row_offset + r: the trainer sets row_offset = rank·B and row_stride =
  // world·B, so rows are numbered through the window's global batch as one process at batch
  // world·B numbers them. row_stride 0: the micro-batch's own row count (one process).
  uint64_t seed = 0;
  int64_t row_offset = 0;
  int64_t row_stride = 0;
  bool training = true;     // false for evaluation (no replay, no replacement)

  // The streams of micro-batch `index` of the window, `rows` rows on this rank.
  RowStreams streams(int64_t index, int64_t rows) const {
    return {seed, step, index * (row_stride > 0 ? row_stride : rows) + row_offset};
  }
};

// The trainer reads the loss only after queuing its backward: an objective keeps what it needs on
// the host for later (end_window), so that the GPU's queue never empties between the two.
struct MicroStepResult {
  at::Tensor loss;  // scalar; this micro-batch's share of the global window loss (has grad)
};

class Objective {
 public:
  virtual ~Objective() = default;
  virtual std::string name() const = 0;

  // Called once when training starts from scratch (not on resume). Returns where the draft's
  // weights are to be loaded from: `init_from` (training.init_from: a checkpoint or export
  // directory, or a weights file) or the objective's own alias of it; the trainer loads them
  // through the draft registry (model/draft_registry.h). When that is "", the objective
  // initialises what it derives from the frozen target weights (e.g. DSpine's transfer space).
  virtual std::string on_fresh_start(const std::string& init_from) = 0;

  // Optimizer updates per window: RL objectives reuse one rollout for several (the trainer runs
  // every micro_step again, then steps the optimizer, once per update; end_window comes after
  // the last update's micro-steps).
  virtual int64_t updates_per_window() const { return 1; }

  // Sees the whole window before any micro_step; reduces global normalizers across ranks.
  virtual void begin_window(const std::vector<data::DraftBatch>& micro_batches,
                            StepContext& context) = 0;
  // Micro-batch `index` of the current window, with autograd.
  virtual MicroStepResult micro_step(const data::DraftBatch& batch, int64_t index,
                                     StepContext& context) = 0;
  // Window metrics (loss terms, accuracy...), already reduced over ranks. Keys become JSONL keys.
  virtual std::map<std::string, double> end_window(StepContext& context) = 0;
  // The keys of end_window's metrics that show progress beside the loss on the console: none by
  // default; GSPO's loss does not show progress, its reward and accepted length do.
  virtual std::vector<std::string> progress_metrics() const { return {}; }

  // No-grad evaluation of one batch: every loss term and metric (reduced over ranks).
  virtual std::map<std::string, double> evaluate(const data::DraftBatch& batch,
                                                 StepContext& context) = 0;

  // The trainer's phase hook (train/trainer.h): an objective may split the trainer's "replay"
  // into sub-phases by announcing them from micro_step (DSpine: "forward", "objective",
  // "backward"); the next trainer phase ends the last one. Benchmarks time them.
  using PhaseHook = std::function<void(const std::string& phase)>;
  void set_phase_hook(PhaseHook hook) { phase_hook_ = std::move(hook); }

 protected:
  void announce(const char* phase) const {
    if (phase_hook_) phase_hook_(phase);
  }

 private:
  PhaseHook phase_hook_;
};

}  // namespace dspine::objectives
