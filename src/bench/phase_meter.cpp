#include "bench/phase_meter.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>

#include "bench/cpu_memory.h"
#include "bench/kernel_profile.h"

namespace dspine::bench {
namespace {

bool is_replay_phase(const std::string& phase) {
  return std::find(std::begin(kReplayPhases), std::end(kReplayPhases), phase) !=
         std::end(kReplayPhases);
}

// Now, on the host and (CUDA) on the trainer's stream.
Mark mark(bool cuda, int device) {
  Mark m;
  m.host = std::chrono::steady_clock::now();
  if (cuda) {
    cudaEvent_t event = nullptr;
    C10_CUDA_CHECK(cudaEventCreate(&event));
    C10_CUDA_CHECK(cudaEventRecord(event, c10::cuda::getCurrentCUDAStream(device).stream()));
    m.event = std::shared_ptr<void>(event,
                                    [](void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); });
  }
  return m;
}

// Seconds from `begin` to `end`: the GPU's time between the events (both complete), else the
// host's.
double seconds_between(const Mark& begin, const Mark& end) {
  if (begin.event && end.event) {
    float ms = 0;
    C10_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(begin.event.get()),
                                        static_cast<cudaEvent_t>(end.event.get())));
    return ms / 1e3;
  }
  return std::chrono::duration<double>(end.host - begin.host).count();
}

}  // namespace

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }
double gib(int64_t bytes) { return static_cast<double>(bytes) / (int64_t(1) << 30); }

double median_after_first(std::vector<double> values) {
  if (values.size() > 1) values.erase(values.begin());  // the first window warms caches up
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

int64_t PhaseMeter::current_bytes() const {
  if (!cuda) return CpuMemoryTracker::install().current_bytes();
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].current;
}

int64_t PhaseMeter::peak_bytes() const {
  if (!cuda) return CpuMemoryTracker::install().peak_bytes();
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].peak;
}

void PhaseMeter::reset_peak() {
  if (!cuda) {
    CpuMemoryTracker::install().reset_peak();
  } else {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device);
  }
}

void PhaseMeter::record(const std::string& name, double elapsed_s, double extra_mib, double peak) {
  seconds[name].push_back(elapsed_s);
  peak_mib[name].push_back(extra_mib);
  peak_gib[name].push_back(peak);
}

void PhaseMeter::on_phase(const std::string& next) {
  const bool nested = is_replay_phase(next);
  // A sub-phase ends at a mark; a top-level phase waits for the trainer's own stream (work the
  // trainer queued on another stream to overlap with this phase, the online target's next
  // batches, is timed where the trainer waits for it), and then the marks queued before it are
  // complete.
  const Mark now_mark = sub_phase.name.empty() && !nested ? Mark{} : mark(cuda, device);
  if (cuda && !nested) c10::cuda::getCurrentCUDAStream(device).synchronize();
  const auto now = std::chrono::steady_clock::now();
  const int64_t peak = peak_bytes();
  total_peak = std::max(total_peak, peak);
  if (!bytes_at_prepass.empty() && !profiling) window_peak = std::max(window_peak, peak);
  phase.peak = std::max(phase.peak, peak);
  sub_phase.peak = std::max(sub_phase.peak, peak);
  auto elapsed = [&](const Span& span) {
    return std::chrono::duration<double>(now - span.started).count();
  };
  if (!sub_phase.name.empty()) close_sub_phase(now_mark);
  if (!nested) time_sub_phases();
  if (!nested && profiles(phase.name)) {
    merge_kernel_profile(kernel_profile, stop_kernel_profile(trace_path));
  }
  if (!nested && !phase.name.empty() && !profiling) close_top_phase(elapsed(phase));
  if (next == "data") begin_window();
  if (next == "end") end_window();
  if (next == "prepass") read_collectives();
  Span& opened = nested ? sub_phase : phase;
  opened.name = next == "end" ? std::string() : next;
  opened.base = current_bytes();
  opened.peak = opened.base;
  reset_peak();
  // `profiling` again: the "data" phase opens the profiled window above.
  if (!nested && profiles(next)) start_kernel_profile(cuda);
  opened.started = std::chrono::steady_clock::now();
  if (nested) opened.begin = now_mark;
}

bool PhaseMeter::profiles(const std::string& name) const {
  return profiling && !profile_phase.empty() && name == profile_phase;
}

void PhaseMeter::read_collectives() {
  bytes_at_prepass.push_back(comm->bytes_moved());
  collectives_at_prepass.push_back(comm->collective_count());
  for (int kind = 0; kind < dist::kCollectiveKinds; ++kind) {
    const auto collective = static_cast<dist::Collective>(kind);
    kind_bytes_at_prepass[kind].push_back(comm->bytes_moved(collective));
  }
}

void PhaseMeter::close_sub_phase(const Mark& end) {
  const auto& name = sub_phase.name;
  untimed.push_back({name, sub_phase.begin, end});
  window_sub_extra[name] = std::max(window_sub_extra[name], sub_phase.peak - sub_phase.base);
  window_sub_peak[name] = std::max(window_sub_peak[name], sub_phase.peak);
  sub_phase.name.clear();
}

void PhaseMeter::time_sub_phases() {
  for (const auto& closed : untimed) {
    window_sub_seconds[closed.name] += seconds_between(closed.begin, closed.end);
  }
  untimed.clear();
}

int64_t PhaseMeter::entries(const std::string& phase) const {
  const auto count = occurrences.find(phase);
  return count == occurrences.end() ? 1 : count->second;
}

void PhaseMeter::close_top_phase(double elapsed_s) {
  const std::string& name = phase.name;
  window_top_seconds[name] += elapsed_s;
  window_top_extra[name] = std::max(window_top_extra[name], phase.peak - phase.base);
  window_top_peak[name] = std::max(window_top_peak[name], phase.peak);
  ++window_top_count[name];
  if (name == "data") window_seconds.push_back(0);  // a window: data, prepass, ...
  window_seconds.back() += elapsed_s;
}

void PhaseMeter::begin_window() {
  if (windows++ != profile_window) return;
  profiling = true;
  if (profile_phase.empty()) start_kernel_profile(cuda);
}

void PhaseMeter::end_window() {
  if (profiling) {
    profiling = false;
    if (profile_phase.empty()) kernel_profile = stop_kernel_profile(trace_path);
  } else {
    occurrences = window_top_count;
    for (const auto& [name, total] : window_top_seconds) {
      const double count = static_cast<double>(window_top_count[name]);
      record(name, total / count, mib(window_top_extra[name]), gib(window_top_peak[name]));
    }
    for (const auto& [name, total] : window_sub_seconds) {
      record(name, total, mib(window_sub_extra[name]), gib(window_sub_peak[name]));
    }
  }
  for (auto* sums : {&window_sub_seconds, &window_top_seconds}) sums->clear();
  for (auto* counts : {&window_sub_extra, &window_sub_peak, &window_top_extra, &window_top_peak,
                       &window_top_count}) {
    counts->clear();
  }
}

double PhaseMeter::per_step(const std::vector<int64_t>& at_prepass) const {
  if (at_prepass.size() < 2) return 0.0;
  return static_cast<double>(at_prepass.back() - at_prepass.front()) /
         static_cast<double>(at_prepass.size() - 1);
}

}  // namespace dspine::bench
