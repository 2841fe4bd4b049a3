// The step benchmark's meter (docs/benchmarks.md, "Training step benchmark"): fed by the
// trainer's phase hook, it records each phase's wall time and memory, the whole window's peak,
// the collective counters per window, and runs one chosen window under the kernel profiler.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/kernel_profile.h"
#include "dist/communicator.h"

namespace dspine::bench {

// Sub-phases of "replay" an objective may announce (objectives/objective.h).
constexpr const char* kReplayPhases[] = {"forward", "objective", "backward"};

double mib(int64_t bytes);
double gib(int64_t bytes);
// The median of `values` without the first (the first window warms caches up).
double median_after_first(std::vector<double> values);

// A point in a window: the host clock, and on CUDA an event recorded on the trainer's stream.
struct Mark {
  std::chrono::steady_clock::time_point host;
  std::shared_ptr<void> event;  // a cudaEvent_t, destroyed with the last copy of the mark
};

// An open phase: when it began, the bytes held then and the highest absolute peak since.
struct Span {
  std::string name;
  std::chrono::steady_clock::time_point started;
  Mark begin;  // sub-phases: timed between marks, without waiting for the GPU
  int64_t base = 0;
  int64_t peak = 0;
};

// The whole-window peak is taken from the first window's prepass on (model set-up and the final
// checkpoint are not a training step); collective counters are read at every prepass, so the
// per-step figures span whole windows, including the metrics all-reduce that follows "end".
// A phase entered several times in a window (GSPO's updates, each followed by an optimizer step)
// is one sample per window: the mean over its occurrences, whose count is kept. Replay
// sub-phases nest inside "replay" and are summed over a window's micro-batches; their
// boundaries do not wait for the GPU (the host stays ahead of it, as in training): each is an
// event, timed when the next top-level phase synchronises. The profiled window (the last) is kept
// out of the timings and peaks; with `profile_phase` set, only that phase's occurrences in it are
// profiled. CPU memory: the counting allocator (bench/cpu_memory.h); CUDA: the caching
// allocator's statistics.
struct PhaseMeter {
  const dist::Communicator* comm = nullptr;
  bool cuda = false;
  int device = 0;
  int64_t profile_window = -1;  // window index run under the profiler; -1: none
  std::string trace_path;       // where the profiled window's Chrome trace goes ("": nowhere)
  std::string profile_phase;    // the trainer phase profiled alone ("": the whole window)
  int64_t windows = 0;          // windows begun
  bool profiling = false;
  KernelProfile kernel_profile;
  int64_t window_peak = 0;  // bytes, absolute
  int64_t total_peak = 0;   // bytes, absolute, since the process started
  Span phase, sub_phase;
  struct ClosedSubPhase {
    std::string name;
    Mark begin, end;
  };
  std::vector<ClosedSubPhase> untimed;  // until the next top-level phase synchronises
  std::map<std::string, double> window_sub_seconds, window_top_seconds;
  std::map<std::string, int64_t> window_sub_extra, window_sub_peak;  // bytes, max over micros
  std::map<std::string, int64_t> window_top_extra, window_top_peak;  // bytes, max over entries
  std::map<std::string, int64_t> window_top_count;
  std::map<std::string, int64_t> occurrences;  // per window, of the last window recorded
  std::map<std::string, std::vector<double>> seconds, peak_mib, peak_gib;
  std::vector<double> window_seconds;
  std::vector<int64_t> bytes_at_prepass, collectives_at_prepass;
  std::vector<int64_t> kind_bytes_at_prepass[dist::kCollectiveKinds];

  int64_t current_bytes() const;
  int64_t peak_bytes() const;
  void reset_peak();
  void record(const std::string& name, double elapsed_s, double extra_mib, double peak);
  // How many times `phase` was entered in the last window recorded (1 when unknown).
  int64_t entries(const std::string& phase) const;
  // A closed top-level phase, kept for the window's sample.
  void close_top_phase(double elapsed_s);
  // The trainer's phase hook: closes the open phase (or sub-phase) and opens `next`.
  void on_phase(const std::string& next);
  // Whether `name` is the phase profiled alone, in the profiled window.
  bool profiles(const std::string& name) const;
  // The collective counters at a window's prepass.
  void read_collectives();
  // Closes the open sub-phase at `end`; its time is read by time_sub_phases.
  void close_sub_phase(const Mark& end);
  // Adds the closed sub-phases' times (their marks complete: after a synchronisation).
  void time_sub_phases();
  void begin_window();
  // Sub-phases become one sample per window: the sums over its micro-batches.
  void end_window();
  // Mean over the windows between the first and the last prepass (every one complete).
  double per_step(const std::vector<int64_t>& at_prepass) const;
};

}  // namespace dspine::bench
