// `dspine-bench step`: runs a configuration for a few optimizer steps through the real trainer,
// on one process or under `mpirun -np N` with the run's communicator, and reports (rank 0 only,
// one `key: value` or table line each) the median wall time of each phase of a window (DSpine
// splits its replay into forward, objective and backward, summed over the window's
// micro-batches), the peak tensor memory of each phase, the peak over the whole window,
// tokens and proposals per second, the analytic FLOPs of the step with its MFU, and what each
// rank handed to collectives. With --profile, one more window runs under the Kineto profiler and
// its per-kernel table is printed (docs/benchmarks.md, "Training step benchmark"). CPU memory:
// counting allocator; CUDA: the caching allocator's stats.
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
#include "bench/cuda_timing.h"
#include "bench/kernel_profile.h"
#include "bench/step_flops.h"
#include "core/config.h"
#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "data/batch.h"
#include "dist/communicator.h"
#include "dist/launch.h"
#include "objectives/dspine_blocks.h"
#include "objectives/dspine_settings.h"
#include "train/trainer.h"

namespace dspine::bench {
namespace {

struct StepOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  int64_t steps = 6;
  bool profile = false;
  std::string profile_out;
  std::string profile_trace;
};

constexpr const char* kPhases[] = {"data", "prepass", "replay", "optimizer"};
// Sub-phases of "replay" an objective may announce (objectives/objective.h).
constexpr const char* kReplayPhases[] = {"forward", "objective", "backward"};
constexpr double kPeakTflops = 989.0;  // H200 dense bf16 tensor-core peak
constexpr size_t kPrintedKernels = 25;

bool is_replay_phase(const std::string& phase) {
  return std::find(std::begin(kReplayPhases), std::end(kReplayPhases), phase) !=
         std::end(kReplayPhases);
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }
double gib(int64_t bytes) { return static_cast<double>(bytes) / (int64_t(1) << 30); }

// An open phase: when it began, the bytes held then and the highest absolute peak since.
struct Span {
  std::string name;
  std::chrono::steady_clock::time_point started;
  int64_t base = 0;
  int64_t peak = 0;
};

// Fed by the trainer's phase hook. The whole-window peak is taken from the first window's
// prepass on (model set-up and the final checkpoint are not a training step); collective
// counters are read at every prepass, so the per-step figures span whole windows, including
// the metrics all-reduce that follows "end". Replay sub-phases nest inside "replay" and are
// summed over a window's micro-batches. The profiled window (the last) is kept out of the
// timings and peaks.
struct PhaseMeter {
  const dist::Communicator* comm = nullptr;
  bool cuda = false;
  int device = 0;
  int64_t profile_window = -1;  // window index run under the profiler; -1: none
  std::string trace_path;       // where the profiled window's Chrome trace goes ("": nowhere)
  int64_t windows = 0;          // windows begun
  bool profiling = false;
  KernelProfile kernel_profile;
  int64_t window_peak = 0;  // bytes, absolute
  int64_t total_peak = 0;   // bytes, absolute, since the process started
  Span phase, sub_phase;
  std::map<std::string, double> window_sub_seconds;
  std::map<std::string, int64_t> window_sub_extra, window_sub_peak;  // bytes, max over micros
  std::map<std::string, std::vector<double>> seconds, peak_mib, peak_gib;
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

  void record(const std::string& name, double elapsed_s, double extra_mib, double peak) {
    seconds[name].push_back(elapsed_s);
    peak_mib[name].push_back(extra_mib);
    peak_gib[name].push_back(peak);
  }

  void on_phase(const std::string& next) {
    if (cuda) torch::cuda::synchronize(device);
    const auto now = std::chrono::steady_clock::now();
    const int64_t peak = peak_bytes();
    total_peak = std::max(total_peak, peak);
    if (!bytes_at_prepass.empty() && !profiling) window_peak = std::max(window_peak, peak);
    phase.peak = std::max(phase.peak, peak);
    sub_phase.peak = std::max(sub_phase.peak, peak);
    auto elapsed = [&](const Span& span) {
      return std::chrono::duration<double>(now - span.started).count();
    };
    if (!sub_phase.name.empty()) {
      const auto& name = sub_phase.name;
      window_sub_seconds[name] += elapsed(sub_phase);
      window_sub_extra[name] = std::max(window_sub_extra[name], sub_phase.peak - sub_phase.base);
      window_sub_peak[name] = std::max(window_sub_peak[name], sub_phase.peak);
      sub_phase.name.clear();
    }
    const bool nested = is_replay_phase(next);
    if (!nested && !phase.name.empty() && !profiling) {
      record(phase.name, elapsed(phase), mib(phase.peak - phase.base), gib(phase.peak));
      if (phase.name == "data") window_seconds.push_back(0);  // a window: data, prepass, ...
      window_seconds.back() += elapsed(phase);
    }
    if (next == "data") begin_window();
    if (next == "end") end_window();
    if (next == "prepass") {
      bytes_at_prepass.push_back(comm->bytes_moved());
      collectives_at_prepass.push_back(comm->collective_count());
      for (int kind = 0; kind < dist::kCollectiveKinds; ++kind) {
        const auto collective = static_cast<dist::Collective>(kind);
        kind_bytes_at_prepass[kind].push_back(comm->bytes_moved(collective));
      }
    }
    Span& opened = nested ? sub_phase : phase;
    opened.name = next == "end" ? std::string() : next;
    opened.base = current_bytes();
    opened.peak = opened.base;
    reset_peak();
    opened.started = std::chrono::steady_clock::now();
  }

  void begin_window() {
    if (windows++ != profile_window) return;
    profiling = true;
    start_kernel_profile(cuda);
  }

  // Sub-phases become one sample per window: the sums over its micro-batches.
  void end_window() {
    if (profiling) {
      profiling = false;
      kernel_profile = stop_kernel_profile(trace_path);
    } else {
      for (const auto& [name, total] : window_sub_seconds) {
        record(name, total, mib(window_sub_extra[name]), gib(window_sub_peak[name]));
      }
    }
    window_sub_seconds.clear();
    window_sub_extra.clear();
    window_sub_peak.clear();
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

// What the FLOP count needs from the first window's micro-batches, both as expected under uniform
// anchor sampling from the valid positions: the mean anchor position, i.e. the mean context prefix
// a block sees (the attention term), and the distinct teacher positions per row (the teacher
// logits term).
struct AnchorStats {
  int64_t anchors = 0, proposals = 0;
  double anchor_sum = 0.0, teacher_sum = 0.0;
  int64_t batches = 0;

  void add(const data::DraftBatch& batch) {
    auto valid = objectives::valid_anchor_positions(batch.loss_mask).to(torch::kDouble).cpu();
    auto positions = torch::arange(valid.size(1), valid.options());
    auto per_row = (valid * positions).sum(1) / valid.sum(1).clamp_min(1.0);
    anchor_sum += per_row.mean().item<double>();
    double teacher = 0.0;
    for (int64_t r = 0; r < valid.size(0); ++r) {
      const auto row = valid[r].contiguous();
      const double* v = row.data_ptr<double>();
      teacher += expected_teacher_positions(std::vector<bool>(v, v + row.numel()), anchors,
                                            proposals);
    }
    teacher_sum += teacher / static_cast<double>(std::max<int64_t>(valid.size(0), 1));
    ++batches;
  }
  double mean(double sum) const { return batches > 0 ? sum / static_cast<double>(batches) : 0.0; }
};

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
  const bool profile =
      options.profile || !options.profile_out.empty() || !options.profile_trace.empty();
  // Output files fail before the run, not after it.
  for (const auto& [flag, path] : {std::pair{"--profile-out", &options.profile_out},
                                   std::pair{"--profile-trace", &options.profile_trace}}) {
    if (path->empty() || comm->rank() != 0) continue;
    std::FILE* out = std::fopen(path->c_str(), "w");
    if (out == nullptr) fail("{} {}: cannot write the file", flag, *path);
    std::fclose(out);
  }
  config.training.total_steps = options.steps + (profile ? 1 : 0);  // + the profiled window
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
  if (profile) meter.profile_window = options.steps;
  if (comm->rank() == 0) meter.trace_path = options.profile_trace;
  if (!meter.cuda) CpuMemoryTracker::install();
  const bool dspine = config.objective.name == "dspine";
  train::Trainer trainer(config, comm);
  trainer.set_phase_hook([&](const std::string& phase) { meter.on_phase(phase); });
  AnchorStats anchor_stats;
  if (dspine) {
    anchor_stats.anchors = objectives::read_dspine_settings(config).num_anchors;
    anchor_stats.proposals = config.model.block_size - 1;
    trainer.set_batch_hook([&](int64_t step, int64_t, data::DraftBatch& batch) {
      if (step == 0) anchor_stats.add(batch);
    });
  }
  const auto result = trainer.run();
  meter.total_peak = std::max(meter.total_peak, meter.peak_bytes());
  const double bytes_per_step = meter.per_step(meter.bytes_at_prepass);
  const double collectives_per_step = meter.per_step(meter.collectives_at_prepass);
  const double peak_gib =
      gib(static_cast<int64_t>(max_over_ranks(*comm, device, double(meter.window_peak))));
  const double total_peak_gib =
      gib(static_cast<int64_t>(max_over_ranks(*comm, device, double(meter.total_peak))));
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
  std::printf("steps: %lld (medians over steps 2..)%s\n", static_cast<long long>(options.steps),
              profile ? ", then one profiled step" : "");
  // An RL window is a rollout followed by its updates, in the trainer's prepass/replay phases.
  const bool rl = config.objective.name == "gspo";
  std::printf("%-10s %12s %16s %10s\n", "phase", "time_ms", "peak_extra_MiB", "peak_GiB");
  auto phase_row = [&](const std::string& label, const std::string& phase) {
    std::printf("%-10s %12.2f %16.2f %10.3f\n", label.c_str(),
                1e3 * median_after_first(meter.seconds[phase]),
                median_after_first(meter.peak_mib[phase]),
                median_after_first(meter.peak_gib[phase]));
  };
  for (const char* phase : kPhases) {
    const std::string name = !rl                           ? phase
                             : std::string(phase) == "prepass" ? "rollout"
                             : std::string(phase) == "replay"  ? "update"
                                                               : phase;
    phase_row(name, phase);
    if (std::string(phase) != "replay") continue;
    for (const char* sub : kReplayPhases) {
      if (meter.seconds.count(sub)) phase_row(sub, sub);  // summed over the micro-batches
    }
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
  auto per_second = [](double count, double s) { return s > 0 ? count / s : 0.0; };
  std::printf("tokens_per_window: %.0f\n", tokens);
  std::printf("tokens_per_s: %.1f\n", per_second(tokens, window_s));
  std::printf("tokens_per_s_per_gpu: %.1f\n", per_second(tokens, window_s) / world);
  if (dspine) {
    const auto settings = objectives::read_dspine_settings(config);
    const int64_t rows = t.batch_size * t.accumulation_steps * world;
    const double proposals =
        static_cast<double>(rows * settings.num_anchors * (config.model.block_size - 1));
    std::printf("proposals_per_window: %.0f\n", proposals);
    std::printf("proposals_per_s: %.1f\n", per_second(proposals, window_s));
    // One rank's replay: accumulation_steps forward + backward micro-steps.
    const StepShape shape{t.batch_size, config.data.seq_len, settings.num_anchors,
                          anchor_stats.mean(anchor_stats.anchor_sum),
                          anchor_stats.mean(anchor_stats.teacher_sum)};
    const auto parts = dspine_step_flops(config.model, shape);
    const double micro = static_cast<double>(t.accumulation_steps);
    const double flop = micro * total_flops(parts);
    const double replay_s = median_after_first(meter.seconds["replay"]);
    const double achieved = per_second(flop, replay_s) / 1e12;
    std::printf("mean_anchor: %.1f\n", shape.mean_anchor);
    std::printf("teacher_positions_per_row: %.1f\n", shape.teacher_positions);
    std::printf("step_tflop: %.6g\n", flop / 1e12);
    for (const auto& part : parts) {
      std::printf("step_tflop.%s: %.6g\n", part.name.c_str(),
                  micro * (part.forward + part.backward) / 1e12);
    }
    std::printf("replay_tflops: %.4g\n", achieved);
    std::printf("mfu_vs_peak: %.3f (of %.0f TFLOP/s dense bf16)\n", achieved / kPeakTflops,
                kPeakTflops);
    if (meter.cuda) {
      const double gemm = bf16_gemm_tflops();  // [16384, 4096] × [4096, 12288]
      std::printf("gemm_tflops_measured: %.1f\n", gemm);
      std::printf("mfu_vs_gemm: %.3f\n", gemm > 0 ? achieved / gemm : 0.0);
    } else {
      std::printf("gemm_tflops_measured: n/a (cpu)\n");
    }
  }
  std::printf("peak_allocated_gib_max_rank: %.3f\n", peak_gib);
  std::printf("peak_allocated_gib_total_max_rank: %.3f\n", total_peak_gib);
  std::printf("collective_bytes_per_rank_per_step: %.0f\n", bytes_per_step);
  std::printf("collectives_per_step: %.1f\n", collectives_per_step);
  for (int kind = 0; kind < dist::kCollectiveKinds; ++kind) {
    std::printf("collective_bytes_per_rank_per_step.%s: %.0f\n",
                dist::collective_name(static_cast<dist::Collective>(kind)),
                meter.per_step(meter.kind_bytes_at_prepass[kind]));
  }
  std::printf("final_loss: %.4f\n", result.losses.back());
  std::printf("final_step: %lld\n", static_cast<long long>(result.final_step));
  if (!profile) return;
  meter.kernel_profile.wall_ms = 1e3 * window_s;
  std::printf("\n");
  print_kernel_profile(meter.kernel_profile, stdout, kPrintedKernels);
  if (options.profile_out.empty()) return;
  std::FILE* out = std::fopen(options.profile_out.c_str(), "w");
  if (out == nullptr) fail("--profile-out {}: cannot write the file", options.profile_out);
  print_kernel_profile(meter.kernel_profile, out, 0);
  std::fclose(out);
  std::printf("profile_table: %s\n", options.profile_out.c_str());
}

}  // namespace

void register_step_bench(CLI::App& app) {
  auto options = std::make_shared<StepOptions>();
  auto* command = app.add_subcommand(
      "step", "time, memory, throughput, FLOPs and collective traffic of a training step "
              "(prepass, replay and its forward/objective/backward, optimizer); runs under "
              "mpirun -np N");
  command->add_option("-c,--config", options->config_path, "YAML run configuration");
  command->add_option("--set", options->overrides, "override a key (KEY=VALUE)");
  command->add_option("--steps", options->steps, "optimizer steps to run")
      ->check(CLI::Range(2, 100000));
  command->add_flag("--profile", options->profile,
                    "run one more window under the Kineto profiler and print its kernel table");
  command->add_option("--profile-out", options->profile_out,
                      "write the full per-kernel table (markdown) here; implies --profile");
  command->add_option("--profile-trace", options->profile_trace,
                      "save the profiled window's Chrome trace (JSON) here; implies --profile");
  command->callback([options] { run_step_bench(*options); });
}

}  // namespace dspine::bench
