// `dspine-bench step`: runs a configuration for a few optimizer steps through the real trainer
// and reports, per phase of a window, the median wall time and the peak tensor memory above what
// was held when the phase began (CPU: counting allocator; CUDA: the caching allocator's stats).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/torch.h>

#include "bench/bench.h"
#include "bench/cpu_memory.h"
#include "core/config.h"
#include "core/files.h"
#include "dist/communicator.h"
#include "train/trainer.h"

namespace dspine::bench {
namespace {

struct StepOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  int64_t steps = 6;
};

struct PhaseMeter {
  bool cuda = false;
  int device = 0;
  int64_t phase_base = 0;
  std::string current;
  std::chrono::steady_clock::time_point started;
  std::map<std::string, std::vector<double>> seconds;
  std::map<std::string, std::vector<double>> peak_mib;

  int64_t current_bytes() const {
    if (!cuda) return CpuMemoryTracker::install().current_bytes();
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].current;
  }
  int64_t peak_bytes() const {
    if (!cuda) return CpuMemoryTracker::install().peak_bytes();
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].peak;
  }
  void reset_peak() {
    if (!cuda) {
      CpuMemoryTracker::install().reset_peak();
    } else {
      c10::cuda::CUDACachingAllocator::resetPeakStats(device);
    }
  }

  void on_phase(const std::string& next) {
    if (cuda) torch::cuda::synchronize(device);
    const auto now = std::chrono::steady_clock::now();
    if (!current.empty()) {
      seconds[current].push_back(std::chrono::duration<double>(now - started).count());
      peak_mib[current].push_back(static_cast<double>(peak_bytes() - phase_base) / (1 << 20));
    }
    current = next == "end" ? std::string() : next;
    phase_base = current_bytes();
    reset_peak();
    started = std::chrono::steady_clock::now();
  }
};

double median_after_first(std::vector<double> values) {
  if (values.size() > 1) values.erase(values.begin());  // the first window warms caches up
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

void run_step_bench(const StepOptions& options) {
  auto config = core::load_config(options.config_path, options.overrides);
  const std::string scratch = "/tmp/dspine-bench-step-" + std::to_string(::getpid());
  config.training.total_steps = options.steps;
  config.checkpoint.dir = scratch;
  config.checkpoint.resume = "none";
  config.checkpoint.save_every = 0;
  config.logging.metrics_file = "";
  config.logging.progress = "false";
  config.logging.level = "warn";

  PhaseMeter meter;
  if (config.training.device != "cpu" && torch::cuda::is_available()) meter.cuda = true;
  if (!meter.cuda) CpuMemoryTracker::install();
  train::Trainer trainer(config, dist::make_single_process_communicator());
  trainer.set_phase_hook([&](const std::string& phase) { meter.on_phase(phase); });
  const auto result = trainer.run();
  core::remove_tree(scratch);

  std::printf("step benchmark: %s, %s, A=%lld, B=%lld, S=%lld, %lld steps (median of steps 2..)\n",
              options.config_path.empty() ? "<embedded default>" : options.config_path.c_str(),
              meter.cuda ? "cuda" : "cpu",
              static_cast<long long>(config.training.accumulation_steps),
              static_cast<long long>(config.training.batch_size),
              static_cast<long long>(config.data.seq_len), static_cast<long long>(options.steps));
  std::printf("%-10s %12s %16s\n", "phase", "time_ms", "peak_extra_MiB");
  double total = 0;
  for (const char* phase : {"prepass", "replay", "optimizer"}) {
    const double ms = 1e3 * median_after_first(meter.seconds[phase]);
    total += ms;
    std::printf("%-10s %12.2f %16.2f\n", phase, ms, median_after_first(meter.peak_mib[phase]));
  }
  std::printf("%-10s %12.2f\n", "window", total);
  std::printf("final loss %.4f after %lld steps\n", result.losses.back(),
              static_cast<long long>(result.final_step));
}

}  // namespace

void register_step_bench(CLI::App& app) {
  auto options = std::make_shared<StepOptions>();
  auto* command = app.add_subcommand(
      "step", "time and peak memory of each phase of a training step (prepass, replay, optimizer)");
  command->add_option("-c,--config", options->config_path, "YAML run configuration");
  command->add_option("--set", options->overrides, "override a key (KEY=VALUE)");
  command->add_option("--steps", options->steps, "optimizer steps to run")
      ->check(CLI::Range(2, 100000));
  command->callback([options] { run_step_bench(*options); });
}

}  // namespace dspine::bench
