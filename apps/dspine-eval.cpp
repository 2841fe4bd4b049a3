// dspine-eval: evaluates a DSpine draft on one batch file and prints every loss term and metric
// (dspine.md §7); --dump-grads writes d(loss)/d(parameter) of every trainable parameter. Used for
// parity checks against the reference implementation: explicit anchors / keep / replace_mask in
// the batch file override sampling.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "core/config.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "data/batch_source.h"
#include "dist/communicator.h"
#include "objectives/dspine_objective.h"
#include "objectives/dspine_settings.h"
#include "train/objective_registry.h"

namespace {

using dspine::fail;
namespace core = dspine::core;
namespace objectives = dspine::objectives;

// A checkpoint directory holds model.safetensors; a file is used as is.
std::string weights_file(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) {
    const auto file = fs::path(path) / "model.safetensors";
    if (!fs::exists(file))
      fail("dspine-eval: checkpoint directory {} has no model.safetensors", path);
    return file.string();
  }
  return path;
}

// Every parameter and buffer of the draft must be in the file with its shape; nothing else may be.
void load_weights(torch::nn::Module& module, const core::SafetensorsFile& file) {
  torch::NoGradGuard no_grad;
  size_t used = 0;
  auto load = [&](const std::string& name, torch::Tensor& target) {
    const auto& source = file.at(name);
    if (source.sizes() != target.sizes()) {
      fail("dspine-eval: {} in {} has shape {}, the draft expects {}", name, file.path,
           c10::str(source.sizes()), c10::str(target.sizes()));
    }
    target.copy_(source);
    ++used;
  };
  for (auto& p : module.named_parameters()) load(p.key(), p.value());
  for (auto& b : module.named_buffers()) load(b.key(), b.value());
  if (used != file.tensors.size()) {
    for (const auto& [name, tensor] : file.tensors) {
      if (!module.named_parameters().contains(name) && !module.named_buffers().contains(name)) {
        fail("dspine-eval: {} holds '{}', which is not a DSpine draft tensor", file.path, name);
      }
    }
  }
}

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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dspine-eval: every DSpine loss term and metric for one batch"};
  std::string config_path, weights_path, batch_path, target_path, grads_path;
  int64_t step = 0, total_steps = -1, seed = -1;
  bool training = false;
  app.add_option("-c,--config", config_path, "YAML run configuration (model.architecture dspine)")
      ->required();
  app.add_option("-w,--weights", weights_path, "checkpoint directory or draft .safetensors")
      ->required();
  app.add_option("-b,--batch", batch_path,
                 "safetensors with input_ids, loss_mask, hidden_states, "
                 "target_last_hidden_states [, anchors, keep, replace_mask]")
      ->required();
  app.add_option("--target", target_path,
                 "safetensors with model.embed_tokens.weight and lm_head.weight "
                 "(default: the config's data source)");
  app.add_option("--step", step, "completed optimizer steps (schedules)");
  app.add_option("--total-steps", total_steps, "schedule horizon (default: training.total_steps)");
  app.add_option("--seed", seed, "anchor/replacement RNG seed (default: training.seed)");
  app.add_flag("--training", training, "training mode: draw the replacement mask");
  app.add_option("--dump-grads", grads_path, "write d(loss)/d(parameter) to this safetensors file");
  CLI11_PARSE(app, argc, argv);

  try {
    const auto config = core::load_config(config_path);
    if (dspine::train::find_objective(config).name != "dspine") {
      fail("dspine-eval: {} has objective.name '{}', expected dspine", config_path,
           config.objective.name);
    }
    const bool cuda = config.training.device == "cuda" ||
                      (config.training.device == "auto" && torch::cuda::is_available());
    const torch::Device device(cuda ? torch::kCUDA : torch::kCPU);
    const auto dtype = config.training.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;

    torch::Tensor embed, head;
    if (!target_path.empty()) {
      auto target = core::load_safetensors(target_path);
      embed = target.at("model.embed_tokens.weight");
      head = target.at("lm_head.weight");
    } else {
      auto source = dspine::data::make_batch_source(config, device);
      embed = source->embed_tokens();
      head = source->lm_head();
    }
    auto objective = objectives::make_dspine_objective(
        config, objectives::read_dspine_settings(config), embed, head, device, dtype);
    load_weights(*objective->module(), core::load_safetensors(weights_file(weights_path)));

    auto file = core::load_safetensors(batch_path);
    dspine::data::DraftBatch batch{file.at("input_ids"), file.at("loss_mask"),
                                   file.at("hidden_states"), file.at("target_last_hidden_states")};
    objectives::BlockOverrides overrides{optional_tensor(file, "anchors"),
                                         optional_tensor(file, "keep"),
                                         optional_tensor(file, "replace_mask")};
    auto comm = dspine::dist::make_single_process_communicator();
    objectives::DSpineForwardOptions options;
    options.step = step;
    options.total_steps = total_steps >= 0 ? total_steps : config.training.total_steps;
    options.training = training;
    options.comm = comm.get();
    options.overrides = &overrides;
    auto generator = at::make_generator<at::CPUGeneratorImpl>(
        static_cast<uint64_t>(seed >= 0 ? seed : config.training.seed));

    const bool with_grad = !grads_path.empty();
    torch::AutoGradMode grad_mode(with_grad);
    auto out = objective->training_model().forward(batch, generator, options);

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
      for (const auto& p : objective->module()->named_parameters()) {
        if (!p.value().requires_grad()) continue;
        const auto& g = p.value().grad();
        grads.emplace_back(p.key(), g.defined() ? g.to(torch::kFloat32)
                                                : torch::zeros_like(p.value(), torch::kFloat32));
      }
      core::save_safetensors(grads_path, grads);
      report["grads_file"] = grads_path;
    }
    std::printf("%s\n", report.dump(2).c_str());
  } catch (const std::exception& e) {
    const bool ours = dynamic_cast<const dspine::Error*>(&e) != nullptr;
    std::fprintf(stderr, "%s: %s\n", ours ? "error" : "internal error", e.what());
    return 1;
  }
  return 0;
}
