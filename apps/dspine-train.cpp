// dspine-train: trains a draft model. `mpirun -np N dspine-train --config X.yaml` for several
// ranks; without --config it trains the embedded default configuration.
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include "core/log.h"

#include "cli_usage.h"
#include "core/config.h"
#include "core/config_reference.h"
#include "dist/launch.h"
#include "dist/mpi_context.h"
#include "objectives/acceptance.h"
#include "train/metrics_log.h"
#include "train/objective_registry.h"
#include "train/run_config.h"
#include "train/trainer.h"

namespace {

// "; its last eval/tau ..." from the metrics file of a finished run, "" when it records none.
std::string last_tau(const std::string& metrics_file) {
  if (metrics_file.empty()) return "";
  const auto tau = dspine::train::last_recorded(
      metrics_file, dspine::train::eval_metric(dspine::objectives::kTauMetric));
  if (!tau) return "";
  return fmt::format("; its last eval/tau {:.4f} at step {} ({})", tau->value, tau->step,
                     metrics_file);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dspine-train: trains a DSpine speculative-decoding draft model"};
  std::string config_path;
  std::vector<std::string> overrides;
  std::string resume;
  bool print_config = false;
  bool config_reference = false;
  app.add_option("-c,--config", config_path, "YAML run configuration (default: the embedded one)");
  app.add_option("--set", overrides, "override a key, e.g. --set training.learning_rate=3e-4")
      ->type_name("KEY=VALUE");
  app.add_option("--resume", resume, "none | auto | <checkpoint dir> (same as checkpoint.resume)");
  app.add_flag("--print-config", print_config, "print the resolved configuration and exit");
  app.add_flag("--config-reference", config_reference,
               "print every configuration key as Markdown (docs/config.md) and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return dspine::cli::exit_on_usage_error(app, e);
  }

  dspine::dist::MpiContext mpi(&argc, &argv);
  try {
    if (config_reference) {
      const auto text = dspine::core::config_reference_markdown(dspine::train::objective_names(),
                                                                dspine::train::run_catalog());
      if (mpi.rank() == 0) std::fputs(text.c_str(), stdout);
      return 0;
    }
    if (!resume.empty()) overrides.push_back("checkpoint.resume=" + resume);
    // Every key checked, the objectives' and architectures' maps included: a bad setting fails
    // here, before any set-up; the trainer builds from these settings.
    const auto config = dspine::train::load_run_config(config_path, overrides);
    const auto objective = dspine::train::resolve_run(config);
    if (print_config) {
      if (mpi.rank() == 0) std::fputs(dspine::core::to_yaml(config).c_str(), stdout);
      return 0;
    }
    dspine::log::set_level(config.logging.level);
    if (mpi.rank() != 0) dspine::log::set_level(dspine::core::LogLevel::kWarn);
    const auto layout = dspine::dist::rank_layout();
    const auto device = dspine::dist::training_device(config.training.device, layout.local_rank);
    auto comm = dspine::dist::make_communicator(config.distributed, device);
    dspine::train::Trainer trainer(config, comm, &objective);
    dspine::train::stop_on_signals();  // Ctrl-C or preemption: save at the next step, then exit
    const auto result = trainer.run();
    if (mpi.rank() == 0 && result.losses.empty()) {
      dspine::log::info("nothing to train: the run is already at step {} of {} (checkpoint.dir "
                        "{}){}",
                        result.final_step, config.training.total_steps, config.checkpoint.dir,
                        last_tau(config.logging.metrics_file));
    } else if (mpi.rank() == 0) {
      const std::string& metrics = config.logging.metrics_file;
      dspine::log::info("trained steps {}..{} in {:.1f} s: loss {:.4f} -> {:.4f}; checkpoint {}; "
                        "metrics {}",
                        result.first_step, result.final_step, result.seconds,
                        result.losses.front(), result.losses.back(), result.last_checkpoint,
                        metrics.empty() ? std::string("not written (logging.metrics_file \"\")")
                                        : metrics);
    }
    // Stopped by a signal, after saving: the shell's 128 + signal, so that a scheduler or a
    // script can tell the run is unfinished (docs/checkpoints.md).
    if (result.stop_signal != 0) return 128 + result.stop_signal;
  } catch (const std::exception& e) {
    return mpi.fail_run(e);
  }
  return 0;
}
