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
#include <fmt/format.h>
#include <torch/torch.h>

#include "bench/bench.h"
#include "bench/cpu_memory.h"
#include "bench/cuda_timing.h"
#include "bench/kernel_profile.h"
#include "bench/phase_meter.h"
#include "bench/step_flops.h"
#include "core/config.h"
#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "data/batch.h"
#include "dist/communicator.h"
#include "dist/launch.h"
#include "model/draft_registry.h"
#include "objectives/dspine_blocks.h"
#include "objectives/objective.h"
#include "train/objective_registry.h"
#include "train/run_config.h"
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
  std::string profile_phase;  // a phase as the table names it; "": the whole window
};

constexpr const char* kPhases[] = {"data", "prepass", "replay", "optimizer"};
constexpr double kPeakTflops = 989.0;  // H200 dense bf16 tensor-core peak
constexpr size_t kPrintedKernels = 25;

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
    auto valid = objectives::valid_anchor_positions(batch.loss_mask_on_host()).to(torch::kDouble);
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

// Output files fail before the run, not after it.
void check_output_files(const StepOptions& options) {
  for (const auto& [flag, path] : {std::pair{"--profile-out", &options.profile_out},
                                   std::pair{"--profile-trace", &options.profile_trace}}) {
    if (path->empty()) continue;
    std::FILE* out = std::fopen(path->c_str(), "w");
    if (out == nullptr) fail("{} {}: cannot write the file", flag, *path);
    std::fclose(out);
  }
}

// The run the benchmark measures: its steps (+ the profiled window), a scratch checkpoint
// directory, no metrics file, no progress line, warnings only (this report alone on stdout).
void for_benchmark(core::Config& config, const StepOptions& options, const std::string& scratch,
                   bool profile) {
  config.training.total_steps = options.steps + (profile ? 1 : 0);  // + the profiled window
  config.checkpoint.dir = scratch;
  config.checkpoint.resume = "none";
  config.checkpoint.save_every = 0;
  config.logging.metrics_file = "";
  config.logging.progress = core::ProgressMode::kOff;
  config.logging.level = core::LogLevel::kWarn;
  log::set_level(config.logging.level);  // only this report on stdout
}

// An RL window is a rollout followed by its updates, in the trainer's prepass and replay phases:
// the table names them so.
std::string table_name(const std::string& phase, bool rl) {
  if (!rl) return phase;
  return phase == "prepass" ? "rollout" : phase == "replay" ? "update" : phase;
}

// The trainer phase a table name stands for ("" when none does).
std::string trainer_phase(const std::string& name, bool rl) {
  for (const char* phase : kPhases) {
    if (table_name(phase, rl) == name) return phase;
  }
  return "";
}

// The phase table (a phase entered several times per window, like each GSPO update and the
// optimizer step after it, is timed per entry: `per_window` says how many), the window and the
// separate seam's share.
void print_phases(PhaseMeter& meter, bool rl, double window_s, const train::TrainResult& result) {
  std::printf("%-10s %12s %16s %10s %10s\n", "phase", "time_ms", "peak_extra_MiB", "peak_GiB",
              "per_window");
  auto phase_row = [&](const std::string& label, const std::string& phase) {
    std::printf("%-10s %12.2f %16.2f %10.3f %10lld\n", label.c_str(),
                1e3 * median_after_first(meter.seconds[phase]),
                median_after_first(meter.peak_mib[phase]),
                median_after_first(meter.peak_gib[phase]),
                static_cast<long long>(meter.entries(phase)));
  };
  for (const char* phase : kPhases) {
    phase_row(table_name(phase, rl), phase);
    if (std::string(phase) != "replay") continue;
    for (const char* sub : kReplayPhases) {
      if (meter.seconds.count(sub)) phase_row(sub, sub);  // summed over the micro-batches
    }
  }
  std::printf("%-10s %12.2f\n", "window", 1e3 * window_s);
  std::vector<double> seam_seconds;
  for (const auto& terms : result.terms) {
    const auto seam = terms.find(objectives::kSeamSecondsMetric);
    if (seam != terms.end()) seam_seconds.push_back(seam->second);
  }
  if (!seam_seconds.empty()) {
    const double seam_s = median_after_first(seam_seconds);
    std::printf("%-10s %12.2f   (share of the window: %.3f)\n", "seam", 1e3 * seam_s,
                window_s > 0 ? seam_s / window_s : 0.0);
  }
}

// Proposals per second and the analytic FLOPs of a DSpine replay with its MFU (one rank's replay:
// accumulation_steps forward + backward micro-steps).
void print_dspine_rates(const core::Config& config, const model::DraftSettings& draft, int world,
                        const AnchorStats& anchor_stats, PhaseMeter& meter, double window_s) {
  const auto& t = config.training;
  auto per_second = [](double count, double s) { return s > 0 ? count / s : 0.0; };
  const int64_t rows = t.batch_size * t.accumulation_steps * world;
  const double proposals =
      static_cast<double>(rows * anchor_stats.anchors * (config.model.block_size - 1));
  std::printf("proposals_per_window: %.0f\n", proposals);
  std::printf("proposals_per_s: %.1f\n", per_second(proposals, window_s));
  // One rank's replay: accumulation_steps forward + backward micro-steps.
  const StepShape shape{t.batch_size, config.data.seq_len, anchor_stats.anchors,
                        anchor_stats.mean(anchor_stats.anchor_sum),
                        anchor_stats.mean(anchor_stats.teacher_sum)};
  const auto parts = dspine_step_flops(model::dspine_model_config(config.model, draft), shape);
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
  // prepass: keep_last runs part of the last replay's work in the prepass, so the window's rate
  // is the one that compares across prepass schemes.
  std::printf("window_tflops: %.4g\n", per_second(flop, window_s) / 1e12);
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

void print_profile(PhaseMeter& meter, const StepOptions& options, double window_s) {
  meter.kernel_profile.wall_ms = 1e3 * window_s;
  if (!meter.profile_phase.empty()) {
    // The phase's entries in the profiled window, against their median time per window.
    const auto& phase = meter.profile_phase;
    const int64_t entries = meter.entries(phase);
    meter.kernel_profile.scope =
        fmt::format("the {} {} phase(s) of one window", entries, options.profile_phase);
    meter.kernel_profile.wall_ms = 1e3 * median_after_first(meter.seconds[phase]) * entries;
  }
  std::printf("\n");
  print_kernel_profile(meter.kernel_profile, stdout, kPrintedKernels);
  if (options.profile_out.empty()) return;
  std::FILE* out = std::fopen(options.profile_out.c_str(), "w");
  if (out == nullptr) fail("--profile-out {}: cannot write the file", options.profile_out);
  print_kernel_profile(meter.kernel_profile, out, 0);
  std::fclose(out);
  std::printf("profile_table: %s\n", options.profile_out.c_str());
}

void run_step_bench(const StepOptions& options) {
  auto config = train::load_run_config(options.config_path, options.overrides);
  const c10::Device device =
      dist::training_device(config.training.device, dist::rank_layout().local_rank);
  auto comm = dist::make_communicator(config.distributed, device);
  const std::string scratch = "/tmp/dspine-bench-step-" + shared_id(*comm, device);
  const bool profile = options.profile || !options.profile_out.empty() ||
                       !options.profile_trace.empty() || !options.profile_phase.empty();
  const bool rl = config.objective.name == "gspo";
  if (comm->rank() == 0) check_output_files(options);
  for_benchmark(config, options, scratch, profile);

  PhaseMeter meter;
  meter.comm = comm.get();
  meter.cuda = device.is_cuda();
  meter.device = device.is_cuda() ? device.index() : 0;
  if (profile) meter.profile_window = options.steps;
  if (!options.profile_phase.empty()) {
    meter.profile_phase = trainer_phase(options.profile_phase, rl);
    if (meter.profile_phase.empty()) {
      fail("--profile-phase {}: not a phase of this run (data, {}, {}, optimizer)",
           options.profile_phase, table_name("prepass", rl), table_name("replay", rl));
    }
  }
  if (comm->rank() == 0) meter.trace_path = options.profile_trace;
  if (!meter.cuda) CpuMemoryTracker::install();
  const bool dspine = config.objective.name == "dspine";
  const auto objective = train::resolve_run(config);
  train::Trainer trainer(config, comm, &objective);
  trainer.set_phase_hook([&](const std::string& phase) { meter.on_phase(phase); });
  AnchorStats anchor_stats;
  if (dspine) {
    anchor_stats.anchors = trainer.objective_settings().dspine()->num_anchors;
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
  std::printf("sharding: %s\n", core::to_string(config.distributed.sharding).c_str());
  std::printf("dtype: %s\n", core::to_string(t.dtype).c_str());
  std::printf("data_source: %s\n", core::to_string(config.data.source).c_str());
  std::printf("rows_per_rank: %lld\n", static_cast<long long>(t.batch_size));
  std::printf("seq_len: %lld\n", static_cast<long long>(config.data.seq_len));
  std::printf("accumulation_steps: %lld\n", static_cast<long long>(t.accumulation_steps));
  std::printf("steps: %lld (medians over steps 2..)%s\n", static_cast<long long>(options.steps),
              profile ? ", then one profiled step" : "");
  print_phases(meter, rl, window_s, result);
  auto per_second = [](double count, double s) { return s > 0 ? count / s : 0.0; };
  std::printf("tokens_per_window: %.0f\n", tokens);
  std::printf("tokens_per_s: %.1f\n", per_second(tokens, window_s));
  std::printf("tokens_per_s_per_gpu: %.1f\n", per_second(tokens, window_s) / world);
  if (dspine) {
    print_dspine_rates(config, *objective.draft.settings, world, anchor_stats, meter, window_s);
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
  if (profile) print_profile(meter, options, window_s);
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
  command->add_option("--profile-phase", options->profile_phase,
                      "profile only this phase of the window (e.g. replay, update, rollout); "
                      "implies --profile");
  command->callback([options] { run_step_bench(*options); });
}

}  // namespace dspine::bench
