// dspine-decode: real speculative decoding of a Hugging Face Qwen3 target with a DSpine draft
// (docs/decoding.md). Prompts come from a token-sample JSONL file (each sample's tokens before its
// first supervised one, or its first --prompt-tokens); the draft from a checkpoint, an export or a
// bare draft .safetensors with its config.json beside it; no draft decodes the target alone. Writes
// one JSON line per prompt (--out) and prints τ, acceptance by position, tokens per second with the
// draft and without it (the same cache code, one token per forward) and the speedup.
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/kernel_profile.h"
#include "cli_usage.h"
#include "decode_options.h"
#include "core/error.h"
#include "core/log_stream.h"
#include "target/qwen3_model.h"
#include "data/token_samples.h"
#include "decode/block_drafter.h"
#include "decode/regeneration.h"
#include "decode/speculative_decoder.h"
#include "model/draft_loading.h"
#include "model/dspine_draft.h"
#include "model/hf_draft_config.h"
#include "train/checkpoint.h"

namespace {

namespace fs = std::filesystem;
namespace decode = dspine::decode;
using dspine::fail;

struct Options {
  std::string target, draft, prompts, out, device = "auto", dtype = "auto", walk = "backbone";
  std::string profile_trace;
  int64_t prompt_tokens = 0, samples = 0, offset = 0, batch = 1, max_new_tokens = 128;
  double temperature = 0.0;
  uint64_t seed = 0;
  bool json = false, no_baseline = false, ignore_eos = false, profile = false;
  bool no_cuda_graphs = false;
};

// The draft at `path` (checkpoint or export directory, or a .safetensors file with config.json
// beside it), verified against its manifest, built from its config.json and placed.
dspine::model::DSpineDraft load_draft(const std::string& path, const torch::Device& device,
                                      torch::Dtype dtype) {
  const fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  const fs::path config_json = dir / "config.json";
  if (!fs::exists(config_json)) {
    fail("--draft {}: no config.json in {} describes the draft", path, dir.string());
  }
  dspine::train::verify_weights(path);
  auto config = dspine::model::model_config_from_hf(
      dspine::model::read_json_file(config_json.string()), config_json.string());
  auto draft = dspine::model::build_placed_draft(config, device, dtype);
  dspine::model::load_draft(*draft, path);
  draft->eval();
  return draft;
}

struct Run {
  std::vector<decode::DecodedRow> rows;
  int64_t verifications = 0, generated = 0, tokens = 0, rounds = 0;
  std::vector<int64_t> accepted_by_position;
  std::vector<double> seconds;
  bool cuda_graphs = false;
};

// Every prompt, in batches of o.batch, by `decoder`.
Run decode_all(decode::SpeculativeDecoder& decoder,
               const std::vector<std::vector<int64_t>>& prompts, int64_t batch) {
  Run run;
  for (size_t begin = 0; begin < prompts.size(); begin += batch) {
    const size_t end = std::min(prompts.size(), begin + static_cast<size_t>(batch));
    auto result = decoder.decode({prompts.begin() + begin, prompts.begin() + end});
    run.verifications += result.verifications;
    run.generated += result.generated;
    run.rounds += result.rounds;
    run.seconds.push_back(result.seconds);
    run.cuda_graphs = result.cuda_graphs;
    run.accepted_by_position.resize(result.accepted_by_position.size(), 0);
    for (size_t k = 0; k < result.accepted_by_position.size(); ++k) {
      run.accepted_by_position[k] += result.accepted_by_position[k];
    }
    for (auto& row : result.rows) {
      run.tokens += static_cast<int64_t>(row.tokens.size());
      run.rows.push_back(std::move(row));
    }
  }
  return run;
}

nlohmann::json summary(const Options& o, const Run& run, const Run* baseline, int64_t prompts) {
  nlohmann::json r;
  r["prompts"] = prompts;
  r["batch"] = o.batch;
  r["temperature"] = o.temperature;
  r["max_new_tokens"] = o.max_new_tokens;
  r["draft"] = o.draft.empty() ? nlohmann::json() : nlohmann::json(o.draft);
  if (!o.draft.empty()) r["walk"] = o.walk;
  r["generated_tokens"] = run.tokens;
  r["verifications"] = run.verifications;
  // τ: tokens per target forward after the prefill (the prefill's first token left out).
  r["tau"] = run.verifications > 0 ? static_cast<double>(run.generated) / run.verifications : 0.0;
  for (size_t k = 0; k < run.accepted_by_position.size(); ++k) {
    r["accept_" + std::to_string(k + 1)] =
        run.verifications > 0 ? static_cast<double>(run.accepted_by_position[k]) / run.verifications
                              : 0.0;
  }
  const double seconds = std::accumulate(run.seconds.begin(), run.seconds.end(), 0.0);
  r["seconds"] = seconds;
  r["cuda_graphs"] = run.cuda_graphs;
  r["tokens_per_second"] = seconds > 0 ? run.tokens / seconds : 0.0;
  if (baseline != nullptr) {
    const double base_seconds =
        std::accumulate(baseline->seconds.begin(), baseline->seconds.end(), 0.0);
    r["target_only_seconds"] = base_seconds;
    r["target_only_tokens_per_second"] = base_seconds > 0 ? baseline->tokens / base_seconds : 0.0;
    r["speedup"] = seconds > 0 && base_seconds > 0
                       ? (run.tokens / seconds) / (baseline->tokens / base_seconds)
                       : 0.0;
    if (o.temperature == 0.0) {  // greedy decoding is lossless: the outputs must be equal
      int64_t equal = 0;
      for (size_t i = 0; i < run.rows.size(); ++i) {
        equal += run.rows[i].tokens == baseline->rows[i].tokens ? 1 : 0;
      }
      r["equal_to_target_only"] = equal;
    }
  }
  return r;
}

void print_summary(const nlohmann::json& r) {
  std::printf(
      "decoded %lld prompts (batch %lld, temperature %g): %lld tokens in %.2f s, %.1f tok/s\n",
      static_cast<long long>(r["prompts"].get<int64_t>()),
      static_cast<long long>(r["batch"].get<int64_t>()), r["temperature"].get<double>(),
      static_cast<long long>(r["generated_tokens"].get<int64_t>()), r["seconds"].get<double>(),
      r["tokens_per_second"].get<double>());
  std::printf("  tau %.3f (tokens per target forward, %lld forwards)\n", r["tau"].get<double>(),
              static_cast<long long>(r["verifications"].get<int64_t>()));
  std::string by_position;
  for (int k = 1; r.contains("accept_" + std::to_string(k)); ++k) {
    by_position += (k > 1 ? " " : "") +
                   fmt::format("{:.1f}%", 100 * r["accept_" + std::to_string(k)].get<double>());
  }
  if (!by_position.empty()) std::printf("  accepted by position: %s\n", by_position.c_str());
  if (r.contains("speedup")) {
    std::printf("  target alone: %.1f tok/s; speedup %.2fx\n",
                r["target_only_tokens_per_second"].get<double>(), r["speedup"].get<double>());
  }
  if (r.contains("equal_to_target_only")) {
    std::printf("  greedy output equal to the target's alone: %lld of %lld prompts\n",
                static_cast<long long>(r["equal_to_target_only"].get<int64_t>()),
                static_cast<long long>(r["prompts"].get<int64_t>()));
  }
}

void write_rows(const std::string& path, const Run& run, int64_t offset) {
  std::ofstream out(path);
  if (!out) fail("--out {}: cannot write it", path);
  for (size_t i = 0; i < run.rows.size(); ++i) {
    nlohmann::json line;
    line["prompt_index"] = offset + static_cast<int64_t>(i);
    line["tokens"] = run.rows[i].tokens;
    line["accepted"] = run.rows[i].accepted;
    out << line.dump() << "\n";
  }
  if (!out.flush()) fail("--out {}: writing failed", path);
}

void run_decode(const Options& o) {
  const auto [device, dtype] = dspine::cli::decode_device(o.device, o.dtype);
  torch::NoGradGuard no_grad;
  auto target = dspine::target::Qwen3Model::load_hf(o.target, dtype, device);
  std::unique_ptr<decode::BlockDrafter> drafter;
  if (!o.draft.empty()) {
    auto draft = load_draft(o.draft, device, dtype);
    for (int64_t layer : draft->config().target_layer_ids) {
      if (layer >= target.dims().num_hidden_layers) {
        fail("--draft {} reads target layer {}, but {} has {} layers", o.draft, layer, o.target,
             target.dims().num_hidden_layers);
      }
    }
    drafter = std::make_unique<decode::BlockDrafter>(
        std::move(draft), target.embed_tokens(), target.lm_head(),
        o.walk == "refinement" ? decode::DraftWalk::kRefinement : decode::DraftWalk::kBackbone);
  }
  dspine::data::TokenSamples samples(o.prompts, target.dims().vocab_size, "--prompts");
  const int64_t count = dspine::cli::samples_from(samples, o.offset, o.samples);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t i = 0; i < count; ++i) {
    prompts.push_back(decode::sample_prompt(samples.read(o.offset + i), o.prompt_tokens));
  }

  decode::DecodeSettings settings;
  settings.max_new_tokens = o.max_new_tokens;
  settings.temperature = o.temperature;
  settings.seed = o.seed;
  settings.cuda_graphs = !o.no_cuda_graphs;
  if (!o.ignore_eos) settings.stop_tokens = decode::eos_token_ids(o.target);
  decode::SpeculativeDecoder speculative(target, drafter.get(), settings);
  // The first batch once untimed, so that neither run pays the device's warm-up: lazily loaded
  // kernels and the library's first choices for each shape of a batch of this size, which cost
  // seconds, more than a run of 128 tokens at batch 16.
  const std::vector<std::vector<int64_t>> first_batch(
      prompts.begin(), prompts.begin() + std::min<int64_t>(o.batch, count));
  if (device.is_cuda()) speculative.decode(first_batch);
  if (o.profile) dspine::bench::start_kernel_profile(device.is_cuda());
  const Run run = decode_all(speculative, prompts, o.batch);
  if (o.profile) {
    // Where a round's time goes: the device's kernels against the wall (the gap is the host).
    auto profile = dspine::bench::stop_kernel_profile(o.profile_trace);
    profile.scope = "speculative decoding of every prompt";
    profile.wall_ms = 1e3 * std::accumulate(run.seconds.begin(), run.seconds.end(), 0.0);
    dspine::bench::print_kernel_profile(profile, stderr, 0);
    int64_t kernels = 0;
    for (const auto& row : profile.rows) kernels += row.calls;
    if (profile.device && run.rounds > 0) {
      std::fprintf(stderr,
                   "%.1f kernels per round, prefills included (%lld kernels, %lld rounds)\n",
                   static_cast<double>(kernels) / static_cast<double>(run.rounds),
                   static_cast<long long>(kernels), static_cast<long long>(run.rounds));
    }
  }
  std::unique_ptr<Run> baseline;
  if (drafter != nullptr && !o.no_baseline) {
    decode::SpeculativeDecoder alone(target, nullptr, settings);
    if (device.is_cuda()) alone.decode(first_batch);
    baseline = std::make_unique<Run>(decode_all(alone, prompts, o.batch));
  }
  if (!o.out.empty()) write_rows(o.out, run, o.offset);
  const auto report = summary(o, run, baseline.get(), count);
  if (o.json) {
    std::printf("%s\n", report.dump().c_str());
  } else {
    print_summary(report);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "dspine-decode: speculative decoding of a Qwen3 target with a DSpine draft "
      "(greedy or sampled; without --draft, the target alone): tau, acceptance by "
      "position, tokens per second and the speedup over the target alone"};
  app.add_option("--target", o.target, "Hugging Face Qwen3 directory (config.json, safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--draft", o.draft,
                 "DSpine draft: a checkpoint or export directory, or a .safetensors with its "
                 "config.json beside it (none: the target alone)")
      ->check(CLI::ExistingPath);
  app.add_option("--prompts", o.prompts,
                 "token-sample JSONL: each sample's tokens before its first supervised one")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--prompt-tokens", o.prompt_tokens,
                 "prompt = each sample's first N tokens instead")
      ->check(CLI::PositiveNumber);
  app.add_option("--samples", o.samples, "prompts to decode (default: every sample from --offset)")
      ->check(CLI::PositiveNumber);
  app.add_option("--offset", o.offset, "index of the first sample")->check(CLI::NonNegativeNumber);
  app.add_option("--max-new-tokens", o.max_new_tokens, "tokens generated per prompt at most")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--walk", o.walk,
                 "how the draft fills a block: backbone (every slot from its own logits) or "
                 "refinement (slot after slot through the refinement head)")
      ->check(CLI::IsMember({"backbone", "refinement"}));
  app.add_option("--temperature", o.temperature, "0: greedy; otherwise speculative sampling")
      ->check(CLI::Range(0.0, 1e4));
  app.add_option("--seed", o.seed, "seed of the draws at temperature > 0");
  app.add_option("--batch", o.batch, "prompts decoded together")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--device", o.device, "auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--dtype", o.dtype, "auto (bf16 on CUDA, fp32 on the CPU), fp32 or bf16")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}));
  app.add_option("--out", o.out, "JSONL: prompt_index, tokens, accepted per prompt");
  app.add_flag("--json", o.json, "print the summary as one JSON line");
  app.add_flag("--no-baseline", o.no_baseline, "skip decoding the target alone (no speedup)");
  app.add_flag("--ignore-eos", o.ignore_eos, "generate --max-new-tokens whatever the tokens");
  app.add_flag("--no-cuda-graphs", o.no_cuda_graphs,
               "on CUDA, launch every round's kernels from the host instead of replaying a "
               "captured round");
  app.add_flag("--profile", o.profile,
               "print the speculative run's kernels against its wall time to stderr (Kineto)");
  app.add_option("--profile-trace", o.profile_trace,
                 "with --profile: also save its Chrome trace (kernels linked to the operators "
                 "that launched them) to this file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return dspine::cli::exit_on_usage_error(app, e);
  }
  dspine::log::send_logs_to_stderr();
  try {
    run_decode(o);
  } catch (const std::exception& e) {
    const bool ours = dynamic_cast<const dspine::Error*>(&e) != nullptr;
    std::fprintf(stderr, "%s: %s\n", ours ? "error" : "internal error", e.what());
    return 1;
  }
  return 0;
}
