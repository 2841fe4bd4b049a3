// `dspine-bench step`: runs a configuration for a few optimizer steps through the real trainer,
// on one process or under `mpirun -np N` with the run's communicator, and reports (rank 0 only,
// one `key: value` or table line each) the median wall time of each phase of a window, the peak
// tensor memory above what was held when the phase began, the peak over the whole window, tokens
// per second, and what each rank handed to collectives. CPU memory: counting allocator; CUDA:
// the caching allocator's stats.
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
#include "core/log.h"
#include "dist/communicator.h"
#include "dist/launch.h"
#include "train/trainer.h"

namespace dspine::bench {
namespace {

struct StepOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  int64_t steps = 6;
};

constexpr const char* kPhases[] = {"data", "prepass", "replay", "optimizer"};

// Fed by the trainer's phase hook. The whole-window peak is taken from the first window's
// prepass on (model set-up and the final checkpoint are not a training step); collective
// counters are read at every prepass, so the per-step figures span whole windows, including
// the metrics all-reduce that follows "end".
struct PhaseMeter {
  const dist::Communicator* comm = nullptr;
  bool cuda = false;
  int device = 0;
  int64_t phase_base = 0;
  int64_t window_peak = 0;  // bytes, absolute
  std::string current;
  std::chrono::steady_clock::time_point started;
  std::map<std::string, std::vector<double>> seconds;
  std::map<std::string, std::vector<double>> peak_mib;
  std::vector<double> window_seconds;
  std::vector<int64_t> bytes_at_prepass, collectives_at_prepass;
  std::vector<int64_t> kind_bytes_at_prepass[dist::kCollectiveKinds];

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
    if (!bytes_at_prepass.empty()) window_peak = std::max(window_peak, peak_bytes());
    if (!current.empty()) {
      const double elapsed = std::chrono::duration<double>(now - started).count();
      seconds[current].push_back(elapsed);
      peak_mib[current].push_back(static_cast<double>(peak_bytes() - phase_base) / (1 << 20));
      if (current == "data") window_seconds.push_back(0);  // a window: data, prepass, replay...
      window_seconds.back() += elapsed;
    }
    if (next == "prepass") {
      bytes_at_prepass.push_back(comm->bytes_moved());
      collectives_at_prepass.push_back(comm->collective_count());
      for (int kind = 0; kind < dist::kCollectiveKinds; ++kind) {
        const auto collective = static_cast<dist::Collective>(kind);
        kind_bytes_at_prepass[kind].push_back(comm->bytes_moved(collective));
      }
    }
    current = next == "end" ? std::string() : next;
    phase_base = current_bytes();
    reset_peak();
    started = std::chrono::steady_clock::now();
  }

  // Mean over the windows between the first and the last prepass (every one complete).
  double per_step(const std::vector<int64_t>& at_prepass) const {
    if (at_prepass.size() < 2) return 0.0;
    return static_cast<double>(at_prepass.back() - at_prepass.front()) /
           static_cast<double>(at_prepass.size() - 1);
  }
};

double median_after_first(std::vector<double> values) {
  if (values.size() > 1) values.erase(values.begin());  // the first window warms caches up
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

// Where `comm` takes its tensors: NCCL reduces device tensors, MPI host tensors.
torch::TensorOptions collective_options(const dist::Communicator& comm, const c10::Device& device,
                                        torch::Dtype dtype) {
  return torch::TensorOptions().dtype(dtype).device(comm.backend() == "nccl" ? device
                                                                              : c10::kCPU);
}

double max_over_ranks(dist::Communicator& comm, const c10::Device& device, double value) {
  auto tensor = torch::tensor({value}, collective_options(comm, device, torch::kDouble));
  comm.all_reduce(tensor, dist::ReduceOp::kMax);
  return tensor.item<double>();
}

// Rank 0's process id on every rank: the checkpoint scratch directory all ranks share.
std::string shared_id(dist::Communicator& comm, const c10::Device& device) {
  auto id = torch::tensor({static_cast<int64_t>(::getpid())},
                          collective_options(comm, device, torch::kLong));
  comm.broadcast(id, 0);
  return std::to_string(id.item<int64_t>());
}

void run_step_bench(const StepOptions& options) {
  auto config = core::load_config(options.config_path, options.overrides);
  const c10::Device device =
      dist::training_device(config.training.device, dist::rank_layout().local_rank);
  auto comm = dist::make_communicator(config.distributed, device);
  const std::string scratch = "/tmp/dspine-bench-step-" + shared_id(*comm, device);
  config.training.total_steps = options.steps;
  config.checkpoint.dir = scratch;
  config.checkpoint.resume = "none";
  config.checkpoint.save_every = 0;
  config.logging.metrics_file = "";
  config.logging.progress = "false";
  config.logging.level = "warn";
  log::set_level(config.logging.level);  // only this report on stdout

  PhaseMeter meter;
  meter.comm = comm.get();
  meter.cuda = device.is_cuda();
  meter.device = device.is_cuda() ? device.index() : 0;
  if (!meter.cuda) CpuMemoryTracker::install();
  train::Trainer trainer(config, comm);
  trainer.set_phase_hook([&](const std::string& phase) { meter.on_phase(phase); });
  const auto result = trainer.run();
  const double bytes_per_step = meter.per_step(meter.bytes_at_prepass);
  const double collectives_per_step = meter.per_step(meter.collectives_at_prepass);
  const double peak_gib = max_over_ranks(*comm, device, static_cast<double>(meter.window_peak)) /
                          static_cast<double>(int64_t(1) << 30);
  comm->barrier();  // every rank is done with the final checkpoint
  if (comm->rank() != 0) return;
  core::remove_tree(scratch);

  const auto& t = config.training;
  const int world = comm->world_size();
  const double tokens = static_cast<double>(t.batch_size * config.data.seq_len *
                                            t.accumulation_steps * world);
  const double window_s = median_after_first(meter.window_seconds);
  std::printf("config: %s\n",
              options.config_path.empty() ? "<embedded default>" : options.config_path.c_str());
  std::printf("device: %s\n", meter.cuda ? "cuda" : "cpu");
  std::printf("world_size: %d\n", world);
  std::printf("backend: %s\n", comm->backend().c_str());
  std::printf("sharding: %s\n", config.distributed.sharding.c_str());
  std::printf("dtype: %s\n", t.dtype.c_str());
  std::printf("data_source: %s\n", config.data.source.c_str());
  std::printf("rows_per_rank: %lld\n", static_cast<long long>(t.batch_size));
  std::printf("seq_len: %lld\n", static_cast<long long>(config.data.seq_len));
  std::printf("accumulation_steps: %lld\n", static_cast<long long>(t.accumulation_steps));
  std::printf("steps: %lld (medians over steps 2..)\n", static_cast<long long>(options.steps));
  // An RL window is a rollout followed by its updates, in the trainer's prepass/replay phases.
  const bool rl = config.objective.name == "gspo";
  std::printf("%-10s %12s %16s\n", "phase", "time_ms", "peak_extra_MiB");
  for (const char* phase : kPhases) {
    const std::string name = !rl                           ? phase
                             : std::string(phase) == "prepass" ? "rollout"
                             : std::string(phase) == "replay"  ? "update"
                                                               : phase;
    std::printf("%-10s %12.2f %16.2f\n", name.c_str(),
                1e3 * median_after_first(meter.seconds[phase]),
                median_after_first(meter.peak_mib[phase]));
  }
  std::printf("%-10s %12.2f\n", "window", 1e3 * window_s);
  std::vector<double> seam_seconds;
  for (const auto& terms : result.terms) {
    if (terms.count("time/seam_s")) seam_seconds.push_back(terms.at("time/seam_s"));
  }
  if (!seam_seconds.empty()) {
    const double seam_s = median_after_first(seam_seconds);
    std::printf("%-10s %12.2f   (share of the window: %.3f)\n", "seam", 1e3 * seam_s,
                window_s > 0 ? seam_s / window_s : 0.0);
  }
  std::printf("tokens_per_window: %.0f\n", tokens);
  std::printf("tokens_per_s: %.1f\n", window_s > 0 ? tokens / window_s : 0.0);
  std::printf("tokens_per_s_per_gpu: %.1f\n", window_s > 0 ? tokens / window_s / world : 0.0);
  std::printf("peak_allocated_gib_max_rank: %.3f\n", peak_gib);
  std::printf("collective_bytes_per_rank_per_step: %.0f\n", bytes_per_step);
  std::printf("collectives_per_step: %.1f\n", collectives_per_step);
  for (int kind = 0; kind < dist::kCollectiveKinds; ++kind) {
    std::printf("collective_bytes_per_rank_per_step.%s: %.0f\n",
                dist::collective_name(static_cast<dist::Collective>(kind)),
                meter.per_step(meter.kind_bytes_at_prepass[kind]));
  }
  std::printf("final_loss: %.4f\n", result.losses.back());
  std::printf("final_step: %lld\n", static_cast<long long>(result.final_step));
}

}  // namespace

void register_step_bench(CLI::App& app) {
  auto options = std::make_shared<StepOptions>();
  auto* command = app.add_subcommand(
      "step", "time, memory, throughput and collective traffic of a training step (prepass, "
              "replay, optimizer); runs under mpirun -np N");
  command->add_option("-c,--config", options->config_path, "YAML run configuration");
  command->add_option("--set", options->overrides, "override a key (KEY=VALUE)");
  command->add_option("--steps", options->steps, "optimizer steps to run")
      ->check(CLI::Range(2, 100000));
  command->callback([options] { run_step_bench(*options); });
}

}  // namespace dspine::bench
