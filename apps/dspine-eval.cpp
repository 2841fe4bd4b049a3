// dspine-eval: measures a trained DSpine draft. --acceptance, its main use, measures the draft's
// acceptance (mean τ of both walks, acceptance by block position, teacher-forced accuracy) on
// held-out samples of the config's data source (DSpine and GSPO checkpoints alike;
// docs/evaluation.md). --batch instead evaluates one batch file and prints every loss term and
// metric (docs/model.md, "The supervised objective"); --dump-grads writes d(loss)/d(parameter) of
// every trainable parameter. Used for parity checks against the reference implementation:
// explicit anchors / keep / replace_mask in the batch file override sampling.
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_usage.h"
#include "core/config.h"
#include "core/error.h"
#include "core/log_stream.h"
#include "core/safetensors.h"
#include "data/batch_source.h"
#include "data/held_out.h"
#include "dist/communicator.h"
#include "model/draft_registry.h"
#include "objectives/acceptance.h"
#include "objectives/dspine_objective.h"
#include "objectives/dspine_settings.h"
#include "train/checkpoint.h"
#include "train/objective_registry.h"
#include "train/run_config.h"

namespace {

using dspine::fail;
namespace core = dspine::core;
namespace objectives = dspine::objectives;

// A [B, N] integer or boolean tensor as nested JSON lists of integers.
nlohmann::json rows_json(const torch::Tensor& t) {
  auto cpu = t.to(torch::kCPU, torch::kInt64).contiguous();
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t b = 0; b < cpu.size(0); ++b) {
    const int64_t* row = cpu[b].data_ptr<int64_t>();
    rows.push_back(std::vector<int64_t>(row, row + cpu.size(1)));
  }
  return rows;
}

torch::Tensor optional_tensor(const core::SafetensorsFile& file, const std::string& name) {
  return file.contains(name) ? file.at(name) : torch::Tensor();
}

// The rows --acceptance measures: --offset, else data.eval_offset's rule for the run that saved
// `weights` (its world size and the samples it has read, when `weights` is a checkpoint; else a
// one-rank run through training.total_steps). Default rows the run trained on are refused.
dspine::data::HeldOutRows acceptance_rows(const core::Config& config, const std::string& weights,
                                          const dspine::data::BatchSource& training,
                                          const dspine::data::BatchSource* held_out,
                                          int64_t samples, int64_t offset) {
  const auto state = dspine::train::checkpoint_state(weights);
  const int64_t world = state ? state->saved_world_size : 1;
  const int64_t trained = state ? state->data_cursor : core::training_rows(config, world);
  const bool chosen = offset >= 0 || config.data.eval_offset >= 0;
  if (offset < 0) offset = core::eval_offset(config, world);
  auto rows = dspine::data::held_out_rows(training, held_out, trained, offset, samples);
  // A run that has not reached total_steps yet must still not be measured on its future rows.
  if (!chosen) {
    dspine::data::require_unread(
        dspine::data::held_out_rows(training, held_out, core::training_rows(config, world),
                                    offset, samples),
        config);
  }
  return rows;
}

// --acceptance: the acceptance figures of the draft from every anchor of the held-out `rows` of
// `source`.
nlohmann::json acceptance_report(const core::Config& config,
                                 objectives::DSpineObjective& objective,
                                 dspine::data::BatchSource& source,
                                 const dspine::data::HeldOutRows& rows,
                                 const torch::Device& device, bool per_block_verifier) {
  auto batches = objectives::held_out_batches(source, rows.offset, rows.samples,
                                              config.training.batch_size, device);
  objectives::AcceptanceEvaluator evaluator(
      objective.dspine_settings(), config.data.seq_len, static_cast<uint64_t>(config.training.seed),
      objective.draft(), objective.training_model().embed_tokens(),
      objective.training_model().lm_head());
  auto comm = dspine::dist::make_single_process_communicator();
  std::unique_ptr<objectives::BlockVerifier> verifier;
  if (per_block_verifier) {
    const auto* target = source.online_target();
    if (target == nullptr) fail("dspine-eval: --per-block-verifier needs data.source: target");
    verifier = std::make_unique<objectives::PerBlockTargetVerifier>(*target);
  } else {
    verifier = objectives::make_verifier(source);
  }
  const auto started = std::chrono::steady_clock::now();
  const auto stats = evaluator.measure(batches, *comm, *verifier);  // ends reading its counts
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  nlohmann::json report = {{"samples", rows.samples},
                           {"offset", rows.offset},
                           {"rows", rows.describe()},
                           {"held_out_source", rows.separate},
                           {"trained_on", rows.trained_on},
                           {"continuation", stats.continuation},
                           {"block_size", config.model.block_size},
                           {"supervised_slots", stats.supervised_slots},
                           {"accepted_histogram", stats.backbone_histogram},
                           {"accepted_histogram_refine", stats.refinement_histogram},
                           {"accept_by_position", stats.backbone_by_position},
                           {"accept_by_position_refine", stats.refinement_by_position}};
  for (const auto& [name, value] : objectives::acceptance_metrics(stats)) report[name] = value;
  report["blocks"] = stats.blocks;
  report["seconds"] = seconds;
  return report;
}

// The report for a reader: τ of both walks, accuracy, acceptance by block position.
void print_acceptance(const nlohmann::json& r) {
  std::printf("acceptance on %s\n  continuation: %s; %lld blocks of %lld proposals in %.2f s\n",
              r["rows"].get<std::string>().c_str(), r["continuation"].get<std::string>().c_str(),
              r["blocks"].get<long long>(), r["block_size"].get<long long>() - 1,
              r["seconds"].get<double>());
  std::printf("  mean tau (accepted + 1): backbone argmax %.4f, refinement walk %.4f, "
              "speculative sampling %.4f\n",
              r["tau"].get<double>(), r["tau_refine"].get<double>(),
              r["tau_sampled"].get<double>());
  std::printf("  teacher-forced accuracy: %.4f over %lld supervised proposals\n",
              r["accuracy"].get<double>(), r["supervised_slots"].get<long long>());
  std::printf("  first k accepted    k:");
  const auto& backbone = r["accept_by_position"];
  const auto& refine = r["accept_by_position_refine"];
  for (size_t k = 1; k <= backbone.size(); ++k) std::printf(" %7zu", k);
  std::printf("\n    backbone argmax     ");
  for (const auto& v : backbone) std::printf(" %7.4f", v.get<double>());
  std::printf("\n    refinement walk     ");
  for (const auto& v : refine) std::printf(" %7.4f", v.get<double>());
  std::printf("\n");
}

// The command line.
struct Options {
  std::string config_path, weights_path, batch_path, target_path, grads_path;
  std::vector<std::string> overrides;
  int64_t step = 0, total_steps = -1, seed = -1, samples = -1, offset = -1;
  bool training = false, acceptance = false, json = false, per_block_verifier = false;
};

void add_options(CLI::App& app, Options& o) {
  app.add_option("-c,--config", o.config_path, "YAML run configuration (model.architecture dspine)")
      ->required();
  app.add_option("--set", o.overrides, "override a key, e.g. --set data.samples=tokens.jsonl")
      ->type_name("KEY=VALUE");
  app.add_option("-w,--weights", o.weights_path,
                 "checkpoint or export directory, or a draft .safetensors")
      ->required();
  app.add_flag("--acceptance", o.acceptance,
               "mean accepted length (backbone argmax and refinement walk), acceptance by block "
               "position and teacher-forced accuracy from every anchor of held-out samples of "
               "the data source");
  app.add_flag("--json", o.json, "--acceptance: print the report as one JSON line");
  app.add_flag("--per-block-verifier", o.per_block_verifier,
               "--acceptance with an online target: verify every block with its own full target "
               "forward (the reference of the cached verifier; slower)");
  app.add_option("--samples", o.samples,
                 "--acceptance: samples to measure (default: data.eval_samples)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  app.add_option("--offset", o.offset,
                 "--acceptance: global index of the first sample (default: data.eval_offset, "
                 "or 0 of a separate held-out source, or past the run's training data)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 50));
  app.add_option("-b,--batch", o.batch_path,
                 "instead of --acceptance: one batch's loss terms and metrics, from a safetensors "
                 "with input_ids, loss_mask, hidden_states, target_last_hidden_states [, anchors, "
                 "keep, replace_mask]");
  app.add_option("--target", o.target_path,
                 "safetensors with model.embed_tokens.weight and lm_head.weight "
                 "(default: the config's data source)");
  app.add_option("--step", o.step, "completed optimizer steps (schedules)");
  app.add_option("--total-steps", o.total_steps,
                 "schedule horizon (default: training.total_steps)");
  app.add_option("--seed", o.seed, "anchor/replacement RNG seed (default: training.seed)");
  app.add_flag("--training", o.training, "training mode: draw the replacement mask");
  app.add_option("--dump-grads", o.grads_path,
                 "write d(loss)/d(parameter) to this safetensors file");
}

// --acceptance: prints the report (JSON with --json) of the held-out rows of `source`.
void run_acceptance(const core::Config& config, const Options& o,
                    objectives::DSpineObjective& objective, dspine::data::BatchSource& source,
                    const torch::Device& device) {
  const int64_t samples = o.samples >= 0 ? o.samples : config.data.eval_samples;
  const auto held_out = dspine::data::make_held_out_source(config, source);
  const auto rows =
      acceptance_rows(config, o.weights_path, source, held_out.get(), samples, o.offset);
  if (rows.trained_on > 0) {
    std::fprintf(stderr, "warning: the measured rows are not held out: %s\n",
                 rows.describe().c_str());
  }
  const auto report = acceptance_report(config, objective, held_out ? *held_out : source, rows,
                                        device, o.per_block_verifier);
  if (o.json) {
    std::printf("%s\n", report.dump().c_str());
  } else {
    print_acceptance(report);
  }
}

// --batch: every loss term and metric of one batch file (and, with --dump-grads, the gradients).
nlohmann::json batch_report(const core::Config& config, const Options& o,
                            objectives::DSpineObjective& objective) {
  auto file = core::load_safetensors(o.batch_path);
  dspine::data::DraftBatch batch{file.at("input_ids"), file.at("loss_mask"),
                                 file.at("hidden_states"), file.at("target_last_hidden_states")};
  objectives::BlockOverrides overrides{optional_tensor(file, "anchors"),
                                       optional_tensor(file, "keep"),
                                       optional_tensor(file, "replace_mask")};
  auto comm = dspine::dist::make_single_process_communicator();
  objectives::DSpineForwardOptions options;
  options.step = o.step;
  options.total_steps = o.total_steps >= 0 ? o.total_steps : config.training.total_steps;
  options.training = o.training;
  options.comm = comm.get();
  options.overrides = &overrides;
  // The batch's rows are global rows 0.. of step `step` (objectives/row_streams.h).
  const objectives::RowStreams streams{
      static_cast<uint64_t>(o.seed >= 0 ? o.seed : config.training.seed), o.step, 0};

  const bool with_grad = !o.grads_path.empty();
  torch::AutoGradMode grad_mode(with_grad);
  auto out = objective.training_model().forward(batch, streams, options);

  const double d = out.denominator.item<double>();
  const double count = std::max(out.count.item<double>(), 1.0);
  nlohmann::json report = {
      {"loss", out.loss.item<double>()},
      {"numerator", out.numerator.item<double>()},
      {"denominator", d},
      {"accuracy", out.correct.item<double>() / count},
      {"accuracy_denom", out.count.item<double>()},
      {"ce_sum", out.ce.item<double>()},
      {"l1_sum", out.l1.item<double>()},
      {"refinement_sum", out.refinement.item<double>()},
      {"alignment_sum", out.alignment.item<double>()},
      {"dspine/backbone_ce", out.ce.item<double>() / std::max(d, 1e-30)},
      {"dspine/backbone_l1", out.l1.item<double>() / std::max(d, 1e-30)},
      {"dspine/refinement_loss", out.refinement.item<double>() / std::max(d, 1e-30)},
      {"dspine/alignment_loss", out.alignment.item<double>() / std::max(d, 1e-30)},
      {"dspine/candidate_coverage", out.coverage.item<double>() / count},
      {"alignment_ce", out.alignment_ce.item<double>()},
      {"alignment_beta", out.schedule.alignment_beta},
      {"replacement_probability", out.schedule.replacement_probability},
      {"anchors", rows_json(out.blocks.anchors)},
      {"keep", rows_json(out.blocks.keep)},
      {"replace_mask", out.replace.defined() ? rows_json(out.replace) : nlohmann::json()},
  };
  if (with_grad) {
    out.loss.backward();
    core::NamedTensors grads;
    for (const auto& p : objective.module()->named_parameters()) {
      if (!p.value().requires_grad()) continue;
      const auto& g = p.value().grad();
      grads.emplace_back(p.key(), g.defined() ? g.to(torch::kFloat32)
                                              : torch::zeros_like(p.value(), torch::kFloat32));
    }
    core::save_safetensors(o.grads_path, grads);
    report["grads_file"] = o.grads_path;
  }
  return report;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dspine-eval: the acceptance of a trained DSpine draft on held-out samples "
               "(--acceptance: mean tau, acceptance by block position, accuracy); with --batch, "
               "every loss term and metric of one batch"};
  Options o;
  add_options(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return dspine::cli::exit_on_usage_error(app, e);
  }
  dspine::log::send_logs_to_stderr();  // stdout carries the report (JSON with --json)

  try {
    const auto config = dspine::train::load_run_config(o.config_path, o.overrides);
    // GSPO trains the same DSpine draft: its checkpoints are measured alike.
    const auto resolved = dspine::train::resolve_run(config);
    if (resolved.settings->dspine() == nullptr) {
      fail("dspine-eval: {} has objective.name '{}', expected dspine or gspo", o.config_path,
           config.objective.name);
    }
    if (!o.acceptance && o.batch_path.empty()) {
      fail("dspine-eval: --acceptance or --batch is required");
    }
    dspine::train::verify_weights(o.weights_path);  // before anything is read from them
    using core::Device;
    const bool cuda = config.training.device == Device::kCuda ||
                      (config.training.device == Device::kAuto && torch::cuda::is_available());
    const torch::Device device(cuda ? torch::kCUDA : torch::kCPU);
    const auto dtype =
        config.training.dtype == core::Dtype::kBf16 ? torch::kBFloat16 : torch::kFloat32;

    torch::Tensor embed, head;
    std::unique_ptr<dspine::data::BatchSource> source;
    if (!o.target_path.empty()) {
      auto target = core::load_safetensors(o.target_path);
      embed = target.at("model.embed_tokens.weight");
      head = target.at("lm_head.weight");
    } else {
      source = dspine::data::make_batch_source(config, device);
      embed = source->embed_tokens();
      head = source->lm_head();
    }
    auto objective = objectives::make_dspine_objective(
        dspine::model::dspine_model_config(config.model, *resolved.draft.settings),
        *resolved.settings->dspine(), config.training.accumulation_steps, embed, head, device,
        dtype);
    resolved.draft.entry->load(*objective->module(), o.weights_path);

    if (o.acceptance) {
      if (!source) fail("dspine-eval: --acceptance reads the config's data source, not --target");
      run_acceptance(config, o, *objective, *source, device);
    } else {
      std::printf("%s\n", batch_report(config, o, *objective).dump(2).c_str());
    }
  } catch (const std::exception& e) {
    const bool ours = dynamic_cast<const dspine::Error*>(&e) != nullptr;
    std::fprintf(stderr, "%s: %s\n", ours ? "error" : "internal error", e.what());
    return 1;
  }
  return 0;
}
