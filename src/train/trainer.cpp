#include "train/trainer.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>

#include <c10/cuda/CUDACachingAllocator.h>
#include "core/log.h"
#include <torch/torch.h>

#include "core/error.h"
#include "data/batch_source.h"
#include "data/held_out.h"
#include "data/target_depth.h"
#include "decode/decoding_evaluation.h"
#include "dist/launch.h"
#include "dist/sharded_parameters.h"
#include "model/draft_registry.h"
#include "model/dspine_draft.h"
#include "model/module_state.h"
#include "model/norm_mlp.h"
#include "train/checkpoint.h"
#include "train/config_diff.h"
#include "train/lr_schedule.h"
#include "train/metrics_log.h"
#include "train/objective_registry.h"
#include "train/optimizer.h"
#include "train/sharding_observer.h"

namespace dspine::train {
namespace fs = std::filesystem;
namespace {

// What a window sums over ranks before its optimizer step, read back by name.
enum WindowTotal : int64_t { kTotalLoss, kTotalTokens, kTotalStopSignals, kWindowTotals };

int64_t peak_memory_bytes(const torch::Device& device) {
  if (!device.is_cuda()) return peak_rss_bytes();
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  return stats.allocated_bytes[0].peak;  // StatType::AGGREGATE
}

// LibTorch's deterministic mode on CUDA: fixed-order kernels where LibTorch has two (the
// memory-efficient attention's backward, which keeps its atomic one unless the mode is strict,
// index_add and scatter reductions), an error naming the op where it has none, and a fixed
// cuBLAS workspace configuration (a user's own setting is kept). Uninitialised memory is not
// filled: nothing reads it.
void use_deterministic_algorithms(bool on) {
  if (on) setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(on, /*warn_only=*/false);
  at::globalContext().setDeterministicFillUninitializedMemory(false);
}

std::atomic<int> stop_signal{0};  // the signal that asked for a stop, 0 = none

// What a fresh run's weights were loaded from: "path (step N)" for a checkpoint; exports and
// weight files carry no step.
std::string starting_point(const std::string& path) {
  const auto state = checkpoint_state(path);
  return state ? fmt::format("{} (step {})", path, state->step) : path;
}

// The measures of progress an objective reports beside its loss (Objective::progress_metrics), as
// " name value" pairs for the console ("" when it reports none).
std::string progress_measures(const std::map<std::string, double>& terms,
                              const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) {
    const auto term = terms.find(name);
    if (term != terms.end()) text += fmt::format(" {} {:.4f}", name, term->second);
  }
  return text;
}

// What made an update non-finite, as far as this rank can tell cheaply: its own loss (and the
// first micro-batch where it went bad), else the first unit whose reduced gradient is not finite.
std::string nonfinite_culprit(double local_loss, int64_t bad_micro, const MasterAdamW& optimizer) {
  if (!std::isfinite(local_loss)) {
    return fmt::format("its loss is {} from micro-batch {}", local_loss, bad_micro);
  }
  const std::string unit = optimizer.first_nonfinite_unit();
  return unit.empty() ? "its loss and gradients are finite (another rank's are not)"
                      : fmt::format("the gradient of unit {} is not finite", unit);
}

}  // namespace

void request_stop(int signal_number) { stop_signal.store(signal_number); }

void stop_on_signals() {
  std::signal(SIGINT, request_stop);
  std::signal(SIGTERM, request_stop);
}

// What the constructor builds once and every run() reads: a run changes none of it (the sources'
// cursors, the weights and the optimizer's state change through their own interfaces).
struct Trainer::Parts {
  core::Config config;
  std::shared_ptr<dist::Communicator> comm;
  torch::Device device{torch::kCPU};
  std::unique_ptr<data::BatchSource> source;
  std::unique_ptr<data::BatchSource> held_out;  // data.eval_*; null: the evaluation reads `source`
  BuiltModel built;
  std::unique_ptr<dist::ShardedParameters> sharded;
  std::unique_ptr<MasterAdamW> optimizer;
  int64_t parameters = 0, trainable_parameters = 0;  // counted before sharding splits them
  PhaseHook phase_hook;
  BatchHook batch_hook;
};

// Where training stands, the one thing a run moves and a checkpoint records: the optimizer steps
// done and the global sample index of the next window. Reading a window moves the cursor; a step
// that stops before it is applied rewinds it to the window's start, so a resume reads it again.
class Trainer::Position {
 public:
  int64_t step() const { return step_; }
  int64_t cursor() const { return cursor_; }
  void resume_at(int64_t step, int64_t cursor) {
    step_ = step;
    cursor_ = window_start_ = cursor;
  }
  void start_window() { window_start_ = cursor_; }
  void read(int64_t samples) { cursor_ += samples; }
  void rewind_window() { cursor_ = window_start_; }
  void finish_step() { ++step_; }

 private:
  int64_t step_ = 0, cursor_ = 0, window_start_ = 0;
};

struct Trainer::State {
  Parts parts;
  Position position;
};

Trainer::Trainer(core::Config config, std::shared_ptr<dist::Communicator> comm,
                 const ResolvedObjective* objective)
    : state_(std::make_unique<State>()) {
  auto& parts = state_->parts;
  parts.config = std::move(config);
  ResolvedObjective resolved_here;
  if (objective == nullptr) {
    resolved_here = resolve_run(parts.config);
    objective = &resolved_here;
  }
  parts.comm = std::move(comm);
  const auto& training = parts.config.training;
  parts.device = dist::training_device(training.device, dist::rank_layout().local_rank);
  if (training.cpu_threads > 0) at::set_num_threads(static_cast<int>(training.cpu_threads));
  if (parts.device.is_cuda()) use_deterministic_algorithms(training.deterministic);
  torch::manual_seed(static_cast<uint64_t>(training.seed));  // model initialisation
  // The source checks its data in full first; the target's depth is recorded in config.json.
  parts.source = data::make_batch_source(parts.config, parts.device);
  parts.config.model.num_target_layers = data::target_depth(parts.config);
  parts.held_out = data::make_held_out_source(parts.config, *parts.source);
  const auto dtype = training.dtype == core::Dtype::kBf16 ? torch::kBFloat16 : torch::kFloat;
  parts.built = build_model(parts.config, *objective, *parts.source, parts.device, dtype);
  for (const auto& p : parts.built.module->parameters()) {
    parts.parameters += p.numel();
    if (p.requires_grad()) parts.trainable_parameters += p.numel();
  }
  const auto& distributed = parts.config.distributed;
  parts.sharded = std::make_unique<dist::ShardedParameters>(
      *parts.built.module, parts.comm, distributed.sharding, distributed.prefetch);
  attach_sharding(*parts.built.module, *parts.sharded, parts.config.model.architecture);
  // The fused AdamW step unless model.fused_kernels is false, on the CPU too: ATen's fused CPU
  // kernel rounds its sqrt correctly, where torch::optim::AdamW's goes through MKL's vector math,
  // whose bits differ by processor (docs/kernels.md, "Optimizer step (AdamW)").
  parts.optimizer = std::make_unique<MasterAdamW>(
      *parts.sharded, training, parts.config.model.fused_kernels != core::FusedKernels::kOff);
}

Trainer::~Trainer() = default;

torch::nn::Module& Trainer::module() { return *state_->parts.built.module; }

const ObjectiveSettings& Trainer::objective_settings() const {
  return *state_->parts.built.settings;
}

void Trainer::set_phase_hook(PhaseHook hook) {
  state_->parts.built.objective->set_phase_hook(hook);
  state_->parts.phase_hook = std::move(hook);
}

void Trainer::set_batch_hook(BatchHook hook) { state_->parts.batch_hook = std::move(hook); }

// One call of Trainer::run: what lives for the call (the checkpoint directory, the metrics file,
// the progress line, the evaluation's share, the step context and the timers) and its parts:
// resume or start, the acceptance evaluation, saving, one window, logging.
class Trainer::Run {
 public:
  Run(const Parts& parts, Position& position, int64_t stop_after);
  TrainResult train();

 private:
  // What one window produced, for the log and the progress line.
  struct Window {
    double loss = 0, lr = 0, grad_norm = 0, tokens = 0;
    bool stop_requested = false;
    std::map<std::string, double> terms;
  };

  void resume_or_start();
  void log_start() const;
  void prepare_evaluation();
  std::map<std::string, double> evaluate();
  std::map<std::string, double> evaluate_decoding(const std::vector<data::DraftBatch>& batches);
  std::string save(int64_t step);
  std::string save_state_before_step();
  [[noreturn]] void stop_before_step(const std::string& why);
  void reject_update(double loss, double grad_norm, double local_loss, int64_t bad_micro);
  // Where this rank's micro-batch `micro` of the window starting at sample `window_cursor` begins.
  int64_t micro_cursor(int64_t window_cursor, int64_t micro) const {
    return window_cursor + micro * world * rows + rank * rows;
  }
  std::vector<data::DraftBatch> read_window();
  void prefetch_next_window();
  Window train_window(const std::vector<data::DraftBatch>& window,
                      std::chrono::steady_clock::time_point data_start);
  void log_window(const Window& w, std::map<std::string, double> eval_record);
  std::chrono::steady_clock::time_point phase(const char* name) const;

  const Parts& parts;
  Position& position;
  const core::Config& cfg;
  const std::vector<std::string> progress_metrics;  // the objective's, shown beside the loss
  const int rank, world;
  const bool leader;
  const int64_t rows, accumulation, total, stop_after;
  int64_t last = 0;
  CheckpointManager checkpoints;
  const LrSchedule schedule;
  std::string resume_from;   // the checkpoint this call resumes, "" for a fresh start
  std::string started_from;  // a fresh run's training.init_from (or its objective's alias)
  std::unique_ptr<MetricsLog> metrics;
  std::unique_ptr<ProgressLine> progress;
  int64_t eval_every = 0, eval_share = 0, eval_start = 0;
  data::BatchSource* eval_source = nullptr;
  std::unique_ptr<objectives::BlockVerifier> verifier;
  objectives::StepContext context;
  TrainResult result;
  std::chrono::steady_clock::time_point started, window_started;
  double tokens_since_log = 0;
  double tokens_per_second = 0;  // over the last logging interval
  int64_t saved_at = -1;
};

Trainer::Run::Run(const Parts& run_parts, Position& run_position, int64_t stop_after_steps)
    : parts(run_parts),
      position(run_position),
      cfg(run_parts.config),
      progress_metrics(run_parts.built.objective->progress_metrics()),
      rank(run_parts.comm->rank()),
      world(run_parts.comm->world_size()),
      leader(rank == 0),
      rows(cfg.training.batch_size),
      accumulation(cfg.training.accumulation_steps),
      total(cfg.training.total_steps),
      stop_after(stop_after_steps),
      checkpoints(cfg.checkpoint.dir, cfg.checkpoint.keep_last, *run_parts.comm),
      schedule(cfg.training.learning_rate, total, cfg.training.warmup_ratio,
               cfg.training.lr_scheduler) {}

void Trainer::Run::resume_or_start() {
  if (cfg.checkpoint.resume == "none" && !checkpoints.latest().empty()) {
    fail("checkpoint.dir {} already holds {}; set checkpoint.resume: auto to continue it or "
         "choose another directory (nothing saved is overwritten)",
         cfg.checkpoint.dir, fs::path(checkpoints.latest()).filename().string());
  }
  if (leader) checkpoints.remove_incomplete();
  parts.comm->barrier();  // nobody reads the directory while the leader cleans it
  // "auto" skips (and sets aside) invalid checkpoints; a named one sets aside those newer than it.
  resume_from = checkpoints.resume_point(cfg.checkpoint.resume);
  if (resume_from.empty()) {
    parts.sharded->gather_all();
    started_from = parts.built.objective->on_fresh_start(cfg.training.init_from);
    if (!started_from.empty()) {
      verify_weights(started_from);  // as a resume verifies its checkpoint
      parts.built.draft.entry->load(*parts.built.module, started_from);
    }
    parts.sharded->load_masters_from_model();  // initialisation done on the model counts
    parts.sharded->release_all();
    return;
  }
  auto loaded = load_checkpoint(resume_from, rank, world, parts.sharded->shards_state());
  check_resume_config(resume_from, loaded.trainer_state, cfg, loaded.saved_world_size, world,
                      leader);
  parts.sharded->gather_all();
  model::load_module_state(*parts.built.module, loaded.model);
  parts.optimizer->load_state(loaded.optimizer, loaded.saved_world_size);
  parts.sharded->release_all();
  // The objective's draws are keyed by step and global row (objectives/row_streams.h): nothing
  // to restore. rng.safetensors is read (checked) and not used; checkpoints written before the
  // row streams hold objective_generator.rank<r> generator states there.
  position.resume_at(loaded.step, loaded.data_cursor);
  if (!leader) return;
  log::info("resumed from {} at step {}", resume_from, position.step());
  if (!cfg.training.init_from.empty()) {
    log::info("training.init_from {} is not read: a resume continues its own checkpoint",
              cfg.training.init_from);
  }
  if (loaded.saved_world_size != world) {
    log::warn("resharded {} from {} to {} ranks: each rank keeps training.batch_size rows "
              "(anchors and samples follow the global row: unchanged with the global batch)",
              resume_from, loaded.saved_world_size, world);
  }
}

void Trainer::Run::log_start() const {
  if (!leader) return;
  const std::string data = cfg.data.source == core::DataSource::kShards
                               ? fmt::format("shards from {}", cfg.data.shards_dir)
                               : core::to_string(cfg.data.source);
  log::info(
      "dspine-train: {} draft, {:.3f} M parameters ({:.3f} M trainable), objective {}; "
      "{} rank{} on {} ({}, sharding {}); data {}; {}",
      cfg.model.architecture, parts.parameters / 1e6, parts.trainable_parameters / 1e6,
      cfg.objective.name, world, world > 1 ? "s" : "", parts.device.str(), parts.comm->backend(),
      core::to_string(cfg.distributed.sharding), data,
      !resume_from.empty()   ? fmt::format("resuming at step {}", position.step())
      : started_from.empty() ? std::string("fresh start")
                             : "fresh start from the weights of " + starting_point(started_from));
}

// The acceptance evaluation (training.eval_every): every rank measures an equal share of the
// held-out samples (zero3 gathers need every rank in each forward) and the counts are summed.
// It measures DSpine drafts only: other drafts (the default configuration switched to
// model.architecture: simple) train without it, with a warning.
void Trainer::Run::prepare_evaluation() {
  eval_every = parts.built.acceptance ? cfg.training.eval_every : 0;
  if (leader && eval_every != cfg.training.eval_every) {
    log::warn("training.eval_every = {} is ignored: the acceptance evaluation measures DSpine "
              "drafts, not model.architecture {}", cfg.training.eval_every,
              cfg.model.architecture);
  }
  eval_share = cfg.data.eval_samples / world;
  if (eval_every > 0 && eval_share * world != cfg.data.eval_samples) {
    fail("data.eval_samples = {} must be a multiple of the {} ranks: each rank measures an equal "
         "share", cfg.data.eval_samples, world);
  }
  eval_start = core::eval_offset(cfg, world);
  eval_source = parts.held_out ? parts.held_out.get() : parts.source.get();
  if (eval_every > 0) {
    const auto held_out =
        data::held_out_rows(*parts.source, parts.held_out.get(), core::training_rows(cfg, world),
                            eval_start, cfg.data.eval_samples);
    // The default rows must be held out; rows the user picked are measured, with a warning.
    if (cfg.data.eval_offset < 0) data::require_unread(held_out, cfg);
    if (leader && held_out.trained_on > 0) {
      log::warn("data.eval_offset = {}: the acceptance evaluation measures {}",
                cfg.data.eval_offset, held_out.describe());
    } else if (leader) {
      log::info("acceptance evaluation every {} steps on {}", eval_every, held_out.describe());
    }
  }
  verifier = objectives::make_verifier(*eval_source);
  if (eval_every > 0 && cfg.training.eval_decode_tokens > 0 &&
      eval_source->online_target() == nullptr) {
    fail("training.eval_decode_tokens = {} decodes with the target itself: it needs data.source "
         "target (the held-out rows come from {})",
         cfg.training.eval_decode_tokens, eval_source->describe());
  }
}

// The eval/... metrics of the model as it is now (logged with the step's record).
std::map<std::string, double> Trainer::Run::evaluate() {
  auto batches = objectives::held_out_batches(*eval_source, eval_start + rank * eval_share,
                                              eval_share, rows, parts.device);
  const auto stats = parts.built.acceptance->measure(batches, *parts.comm, *verifier);
  std::map<std::string, double> record = {
      {eval_metric("offset"), static_cast<double>(eval_start)},
      {eval_metric("samples"), static_cast<double>(cfg.data.eval_samples)}};
  for (const auto& [name, value] : objectives::acceptance_metrics(stats)) {
    record[eval_metric(name)] = value;
  }
  if (leader) {
    log::info("step {} eval: tau {:.3f} (refinement walk {:.3f}), accuracy {:.4f} on {} blocks",
              position.step(), stats.backbone_length, stats.refinement_length, stats.accuracy,
              stats.blocks);
  }
  if (cfg.training.eval_decode_tokens > 0) {
    for (const auto& [name, value] : evaluate_decoding(batches)) record[eval_metric(name)] = value;
  }
  return record;
}

// τ in real decoding of the same held-out rows' prompts (training.eval_decode_tokens). The
// decoding loop runs the draft's layers outside the forward that gathers sharded units, so the
// weights are gathered whole for it, as for a save.
std::map<std::string, double> Trainer::Run::evaluate_decoding(
    const std::vector<data::DraftBatch>& batches) {
  decode::DecodingEvaluationSettings settings;
  settings.new_tokens = cfg.training.eval_decode_tokens;
  settings.prompt_tokens = cfg.training.eval_decode_prompt_tokens;
  settings.temperature = cfg.training.eval_decode_temperature;
  settings.seed = static_cast<uint64_t>(cfg.training.seed);
  auto draft = std::dynamic_pointer_cast<model::DSpineDraftImpl>(parts.built.module);
  if (draft == nullptr) fail("training.eval_decode_tokens: the draft is not a DSpine draft");
  parts.sharded->gather_all();
  auto metrics = decode::decoding_metrics(*eval_source->online_target(), model::DSpineDraft(draft),
                                          batches, settings, *parts.comm);
  parts.sharded->release_all();
  if (leader) {
    log::info("step {} eval: tau in decoding {:.3f} ({} tokens, temperature {})", position.step(),
              metrics[decode::kDecodeTauMetric], metrics[decode::kDecodeTokensMetric],
              settings.temperature);
  }
  return metrics;
}

std::string Trainer::Run::save(int64_t step) {
  CheckpointContents contents;
  parts.sharded->gather_all();  // collective: every rank, though only the leader writes the model
  if (leader) {
    contents.model = model::module_state(*parts.built.module);
    // Gathered per unit, the weights are freed again below; keep a copy of what is saved.
    if (parts.sharded->gathers_parameters_per_unit()) {
      for (auto& item : contents.model) item.second = item.second.to(torch::kCPU, false, true);
    }
  }
  parts.sharded->release_all();
  contents.model_config = parts.built.hf_config;
  contents.optimizer = parts.optimizer->state();
  // No generator state: the draws are keyed by (training.seed, step, global row). The file
  // records the seed that keys them.
  contents.rng.emplace_back("row_streams.seed", torch::tensor({cfg.training.seed}, torch::kInt64));
  contents.trainer_state = {
      {"step", step}, {"data_cursor", position.cursor()}, {"config", core::to_yaml(cfg)}};
  const std::string path = checkpoints.save(step, contents);
  if (leader) log::info("saved {}", path);
  return path;
}

// A checkpoint of the state before the current step: the one save_every or the resume already
// made, else a new one. The cursor must already be back at the step's first window.
std::string Trainer::Run::save_state_before_step() {
  if (saved_at == position.step()) return result.last_checkpoint;
  if (position.step() == result.first_step && !resume_from.empty()) return resume_from;
  return save(position.step());
}

// Every rank alike: rewinds the data cursor to this window's start (resuming reads it again),
// saves the state before the step and stops with `why` and the checkpoint's path.
void Trainer::Run::stop_before_step(const std::string& why) {
  progress->finish();
  position.rewind_window();
  const std::string path = save_state_before_step();
  fail("step {}: {}; the state before this step is saved in {}", position.step() + 1, why, path);
}

// An update whose loss or gradient is not finite (every rank agrees, nothing was applied): warn,
// then skip it or save the state before it and stop (training.on_nonfinite).
void Trainer::Run::reject_update(double loss, double grad_norm, double local_loss,
                                 int64_t bad_micro) {
  const bool stop = cfg.training.on_nonfinite == core::OnNonfinite::kStop;
  if (!stop) ++result.nonfinite_skipped;
  if (leader || !std::isfinite(local_loss)) {
    log::warn("step {}: loss {} (summed over ranks), gradient norm {}; on rank {} {}: {}",
              position.step() + 1, loss, grad_norm, rank,
              nonfinite_culprit(local_loss, bad_micro, *parts.optimizer),
              stop ? std::string("stopping (training.on_nonfinite: stop)")
                   : fmt::format("update skipped, {} so far (training.on_nonfinite: skip)",
                                 result.nonfinite_skipped));
  }
  if (!stop) return;
  parts.optimizer->zero_grad();
  stop_before_step(fmt::format("the loss or gradient is not finite (loss {}, gradient norm {}); "
                               "stopped by training.on_nonfinite: stop",
                               loss, grad_norm));
}

// This rank's micro-batches of the window. Data checked at start-up can still fail here (a file
// changed since): every rank learns of it, saves the state before this window and stops, so
// nothing trained so far is lost.
std::vector<data::DraftBatch> Trainer::Run::read_window() {
  std::vector<data::DraftBatch> window;
  position.start_window();
  const int64_t window_cursor = position.cursor();
  std::string read_error;  // why this rank could not read its share of the window
  try {
    for (int64_t micro = 0; micro < accumulation; ++micro) {
      parts.source->seek(micro_cursor(window_cursor, micro));
      window.push_back(parts.source->next(rows).to(parts.device));
      if (parts.batch_hook) parts.batch_hook(position.step(), micro, window.back());
      position.read(world * rows);
    }
  } catch (const Error& e) {
    read_error = e.what();
  }
  auto read_failed = torch::tensor({read_error.empty() ? 0.0 : 1.0}, torch::kDouble);
  if (world > 1) parts.comm->all_reduce(read_failed);
  if (read_failed.item<double>() > 0) {
    progress->finish();
    position.rewind_window();
    const std::string path = save_state_before_step();
    fail("step {}: {}; the state before this step is saved in {}", position.step() + 1,
         read_error.empty() ? "another rank could not read its data" : read_error, path);
  }
  return window;
}

// The next window's micro-batches at the cursors read_window will read them from: a source that
// can compute them ahead (the online target) does so while this window trains.
void Trainer::Run::prefetch_next_window() {
  if (position.step() + 1 >= last) return;
  for (int64_t micro = 0; micro < accumulation; ++micro) {
    parts.source->prefetch(micro_cursor(position.cursor(), micro), rows);
  }
}

std::chrono::steady_clock::time_point Trainer::Run::phase(const char* name) const {
  if (parts.phase_hook) parts.phase_hook(name);
  return std::chrono::steady_clock::now();
}

// The objective's window: begin_window, then updates_per_window updates of `accumulation`
// micro-steps each, the last one applied after end_window's metrics and the ranks' loss sum.
Trainer::Run::Window Trainer::Run::train_window(const std::vector<data::DraftBatch>& window,
                                                std::chrono::steady_clock::time_point data_start) {
  std::chrono::steady_clock::time_point prepass_start;
  try {
    prepass_start = phase("prepass");
    parts.built.objective->begin_window(window, context);
  } catch (const objectives::WindowFailure& e) {  // thrown on every rank, nothing applied yet
    stop_before_step(e.what());
  }
  const auto replay_start = phase("replay");
  Window w;
  double local_loss = 0;
  int64_t local_tokens = 0;
  w.lr = schedule.at(position.step());
  const int64_t updates = parts.built.objective->updates_per_window();
  int64_t bad_micro = -1;  // the first micro-batch of the update whose local loss is not finite
  // Applies the update unless its loss (`loss`: summed over ranks) or the global gradient norm
  // is not finite, a decision every rank takes alike (training.on_nonfinite).
  auto apply_update = [&](double loss) {
    w.grad_norm = parts.optimizer->gradient_norm();
    if (std::isfinite(loss) && std::isfinite(w.grad_norm)) {
      parts.optimizer->step(w.lr, w.grad_norm);
    } else {
      reject_update(loss, w.grad_norm, local_loss, bad_micro);
    }
    parts.optimizer->zero_grad();
  };
  for (int64_t update = 0; update < updates; ++update) {
    context.update = update;
    local_loss = 0;
    bad_micro = -1;
    std::vector<torch::Tensor> micro_losses;
    for (int64_t micro = 0; micro < accumulation; ++micro) {
      auto out = parts.built.objective->micro_step(window[micro], micro, context);
      // Gradients are reduced over ranks once per update, during its last backward.
      parts.sharded->begin_backward(micro + 1 == accumulation);
      out.loss.backward();
      micro_losses.push_back(out.loss.detach().to(torch::kFloat64));
    }
    // The host reads nothing until the update's backwards and its gradient norm are queued, so
    // the GPU runs them back to back (docs/model.md, "The host stays ahead").
    parts.optimizer->start_gradient_norm();
    const auto losses = torch::stack(micro_losses).cpu();
    for (int64_t micro = 0; micro < accumulation; ++micro) {
      const double micro_loss = losses[micro].item<double>();
      if (!std::isfinite(micro_loss) && bad_micro < 0) bad_micro = micro;
      local_loss += micro_loss;
    }
    if (update + 1 == updates) break;  // the last update steps after end_window, below
    auto reduced = torch::tensor({local_loss}, torch::kDouble);
    parts.comm->all_reduce(reduced);
    // Announced on its own, so that the phases time each update without the step between them.
    phase("optimizer");
    apply_update(reduced.item<double>());
    phase("replay");
  }
  for (const auto& batch : window) local_tokens += batch.input_ids.numel();
  w.terms = parts.built.objective->end_window(context);
  // Reduced before the step: a non-finite sum is some rank's non-finite loss.
  std::vector<double> local(kWindowTotals);
  local[kTotalLoss] = local_loss;
  local[kTotalTokens] = static_cast<double>(local_tokens);
  local[kTotalStopSignals] = static_cast<double>(stop_signal.load());
  auto reduced_totals = torch::tensor(local, torch::kDouble);
  parts.comm->all_reduce(reduced_totals);
  const auto totals = reduced_totals.accessor<double, 1>();
  w.loss = totals[kTotalLoss];
  const auto optimizer_start = phase("optimizer");
  apply_update(w.loss);
  const auto window_end = phase("end");
  auto seconds_between = [](auto a, auto b) {
    return std::chrono::duration<double>(b - a).count();
  };
  auto& terms = w.terms;
  terms["time/data_s"] = seconds_between(data_start, prepass_start);
  terms["time/prepass_s"] = seconds_between(prepass_start, replay_start);
  terms["time/replay_s"] = seconds_between(replay_start, optimizer_start);
  terms["time/optimizer_s"] = seconds_between(optimizer_start, window_end);
  const double step_seconds = seconds_between(data_start, window_end);
  terms["time/step_s"] = step_seconds;
  // An objective that times a part of its step (GSPO: the seam) also gets that part's share.
  const auto seam = terms.find(objectives::kSeamSecondsMetric);
  if (seam != terms.end()) terms["time/seam_share"] = seam->second / step_seconds;
  w.tokens = totals[kTotalTokens];
  w.stop_requested = totals[kTotalStopSignals] > 0;
  return w;
}

// The step's record in the metrics file (every logging.every steps and at the last; an
// evaluation between them gets a record of its own), the log line and the progress line.
void Trainer::Run::log_window(const Window& w, std::map<std::string, double> eval_record) {
  const bool log_now = position.step() % cfg.logging.every == 0 || position.step() == last;
  if (!log_now && !eval_record.empty()) {
    eval_record["step"] = static_cast<double>(position.step());
    metrics->write(eval_record);
  }
  if (log_now) {
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - window_started).count();
    tokens_per_second = tokens_since_log / std::max(seconds, 1e-9);
    window_started = now;
    tokens_since_log = 0;
    std::map<std::string, double> record = w.terms;
    record["step"] = static_cast<double>(position.step());
    record["loss"] = w.loss;
    record["lr"] = w.lr;
    record["grad_norm"] = w.grad_norm;
    record["tokens_per_s"] = tokens_per_second;
    record["nonfinite_skipped"] = static_cast<double>(result.nonfinite_skipped);
    record["memory_bytes"] = static_cast<double>(peak_memory_bytes(parts.device));
    record.insert(eval_record.begin(), eval_record.end());
    metrics->write(record);
    if (leader && !progress->enabled()) {
      log::info("step {}/{} loss {:.4f}{} lr {:.3g} grad_norm {:.3f} {:.0f} tok/s", position.step(),
                total, w.loss, progress_measures(w.terms, progress_metrics), w.lr, w.grad_norm,
                tokens_per_second);
    }
  }
  const double interval_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - window_started).count();
  // Until the first logging interval ends, the rate so far (not 0).
  progress->update(
      position.step(), w.loss, progress_measures(w.terms, progress_metrics),
      tokens_per_second > 0 ? tokens_per_second : tokens_since_log / std::max(interval_s, 1e-9));
}

TrainResult Trainer::Run::train() {
  resume_or_start();
  log_start();
  last = stop_after >= 0 ? std::min(total, position.step() + stop_after) : total;
  if (leader && !cfg.logging.metrics_file.empty()) {
    fs::create_directories(fs::absolute(cfg.logging.metrics_file).parent_path());
  }
  // A resumed run drops the records its predecessor wrote after the checkpoint it resumes from.
  metrics = std::make_unique<MetricsLog>(leader ? cfg.logging.metrics_file : "",
                                         resume_from.empty() ? -1 : position.step());
  progress = std::make_unique<ProgressLine>(
      leader ? cfg.logging.progress : core::ProgressMode::kOff, position.step(), total);
  prepare_evaluation();

  result.first_step = position.step();
  context.total_steps = total;
  context.comm = parts.comm.get();
  // Row r of this rank's micro-batch i is global row i·world·B + rank·B + r of the window: the
  // trainer reads sample cursor + i·world·B + rank·B + r there, so one process at batch world·B
  // gives every sample the same row number.
  context.seed = static_cast<uint64_t>(cfg.training.seed);
  context.row_offset = rank * rows;
  context.row_stride = world * rows;
  context.training = true;
  started = std::chrono::steady_clock::now();
  window_started = started;
  while (position.step() < last) {
    context.step = position.step();
    if (parts.phase_hook) parts.phase_hook("data");
    const auto data_start = std::chrono::steady_clock::now();
    const auto window = read_window();
    prefetch_next_window();
    const Window w = train_window(window, data_start);
    tokens_since_log += w.tokens;
    position.finish_step();
    result.losses.push_back(w.loss);
    result.terms.push_back(w.terms);

    std::map<std::string, double> eval_record;
    if (eval_every > 0 && (position.step() % eval_every == 0 || position.step() == total)) {
      const auto eval_started = std::chrono::steady_clock::now();
      eval_record = evaluate();
      const auto eval_time = std::chrono::steady_clock::now() - eval_started;
      eval_record[eval_metric("time_s")] = std::chrono::duration<double>(eval_time).count();
      window_started += eval_time;  // throughput counts training time only
    }
    log_window(w, std::move(eval_record));
    if (cfg.checkpoint.save_every > 0 && position.step() % cfg.checkpoint.save_every == 0) {
      result.last_checkpoint = save(position.step());
      saved_at = position.step();
    }
    if (w.stop_requested) {
      // A rank that was not signalled itself stops for another's preemption: SIGTERM.
      result.stop_signal = stop_signal.load() != 0 ? stop_signal.load() : SIGTERM;
      break;
    }
  }
  progress->finish();
  if (saved_at != position.step() && position.step() > result.first_step)
    result.last_checkpoint = save(position.step());
  if (result.stop_signal != 0 && leader) {
    log::warn(
        "stopped by signal {} after step {}: saved {}; run again with checkpoint.resume: "
        "auto to continue",
        result.stop_signal, position.step(), result.last_checkpoint);
  }
  parts.sharded->gather_all();  // callers (tests, exports) read whole weights after a run
  result.final_step = position.step();
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

TrainResult Trainer::run(int64_t stop_after) {
  return Run(state_->parts, state_->position, stop_after).train();
}

}  // namespace dspine::train
