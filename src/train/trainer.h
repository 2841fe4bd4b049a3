// The training loop (docs/model.md, "Normalisation over a window"): optimizer windows of
// accumulation_steps micro-batches, AdamW on fp32 masters with warmup + cosine LR and global-norm
// clipping, gradients reduced over ranks and parameters sharded by distributed.sharding
// (docs/distributed.md), metrics to JSONL, sharded checkpoints with exact resume (and resharding to
// another world size).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "dist/communicator.h"

namespace torch::nn {
class Module;
}
namespace dspine::data {
struct DraftBatch;
}

namespace dspine::train {

struct ObjectiveSettings;  // train/objective_registry.h
struct ResolvedObjective;  // train/objective_registry.h

struct TrainResult {
  std::vector<double> losses;  // global window loss of every optimizer step run by this call
  int64_t first_step = 0;      // the step this call started at (> 0 after a resume)
  int64_t final_step = 0;      // optimizer steps completed in total
  std::string last_checkpoint; // "" when nothing was saved
  double seconds = 0;
  std::vector<std::map<std::string, double>> terms;  // the objective's metrics of every step
  // The signal (SIGINT/SIGTERM) whose stop request ended the run early, after a save; 0 = none.
  int stop_signal = 0;
  int64_t nonfinite_skipped = 0;  // steps not applied: non-finite loss or gradient (on_nonfinite)
};

// Asks every running trainer to save a checkpoint at its next step boundary and return. Safe to
// call from a signal handler; all ranks agree on the step through the step's all-reduce.
void request_stop(int signal_number);
// Installs request_stop for SIGINT and SIGTERM (preemption).
void stop_on_signals();

class Trainer {
 public:
  // `objective`: the configuration's objective and draft as the caller already resolved them
  // from `config` (resolve_run); null: resolved here.
  Trainer(core::Config config, std::shared_ptr<dist::Communicator> comm,
          const ResolvedObjective* objective = nullptr);
  ~Trainer();

  // Trains until training.total_steps, or for at most `stop_after` optimizer steps when
  // stop_after >= 0 (then saves, as a pre-empted job would).
  TrainResult run(int64_t stop_after = -1);

  torch::nn::Module& module();
  // The objective's settings as parsed for this run (e.g. objective.dspine's num_anchors).
  const ObjectiveSettings& objective_settings() const;

  // Called when a phase of a window starts ("data": reading the window's batches, including an
  // online target's forward; "prepass": begin_window, i.e. the CE-only prepass and the global
  // normalizers; "replay": the micro-steps with backward; "optimizer") and with
  // "end" after the optimizer step. Benchmarks use it to measure each phase. The objective gets
  // it too and may announce sub-phases of "replay" (objectives/objective.h).
  using PhaseHook = std::function<void(const std::string& phase)>;
  void set_phase_hook(PhaseHook hook);

  // Called with every micro-batch (step, index in the window) before the objective sees it.
  // Tests use it to inject faults (a NaN in one rank's hidden states).
  using BatchHook = std::function<void(int64_t step, int64_t micro, data::DraftBatch& batch)>;
  void set_batch_hook(BatchHook hook);

 private:
  struct Parts;    // built by the constructor, read by every run
  class Position;  // the step and the data cursor, which a run moves
  struct State;    // both
  class Run;       // one call of run()
  std::unique_ptr<State> state_;
};

}  // namespace dspine::train
