// dspine-data: writes a target's samples as safetensors shards (`generate`: the embedded
// synthetic target, or a real Qwen3 target over token samples, shared by the ranks of an mpirun),
// summarizes a shard directory (`inspect`), including how peaked the target's next-token
// distributions are — the property that makes the data learnable by a draft — checks token
// samples, shard directories and SpecForge samples in full as training does at start-up, timed
// (`check`), exports a trained draft in the Hugging Face layout SpecForge reads (`export`), and
// continues token samples' prompts with the target alone (`regenerate`).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "cli_usage.h"
#include "decode_options.h"
#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "data/batch_source.h"
#include "data/shards.h"
#include "data/specforge_source.h"
#include "target/qwen3_model.h"
#include "data/token_samples.h"
#include "decode/regeneration.h"
#include "dist/launch.h"
#include "dist/mpi_context.h"
#include "train/checkpoint.h"
#include "train/hf_export.h"
#include "train/run_config.h"

namespace {

namespace core = dspine::core;
namespace data = dspine::data;
namespace fs = std::filesystem;

struct GenerateArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string out_dir;
  std::string target_dir;    // a real target: data.source target, data.target.path
  std::string samples_file;  // its token samples: data.samples
  data::ShardWriteOptions options;
};

// Rank r computes shards r, r + world, ... on its training device (GPU = local rank when there
// are GPUs); rank 0 prepares the directory before and writes the index after, between barriers.
void generate(GenerateArgs args, const dspine::dist::MpiContext& mpi) {
  if (!args.target_dir.empty()) {
    args.overrides.push_back("data.source=target");
    args.overrides.push_back("data.target.path=" + args.target_dir);
  }
  if (!args.samples_file.empty()) args.overrides.push_back("data.samples=" + args.samples_file);
  const core::Config config = dspine::train::load_run_config(args.config_path, args.overrides);
  using core::DataSource;
  if (config.data.source != DataSource::kSynthetic && config.data.source != DataSource::kTarget) {
    dspine::fail("dspine-data generate: data.source must be synthetic or target, got '{}'",
                 core::to_string(config.data.source));
  }
  if (mpi.rank() != 0) dspine::log::set_level(dspine::core::LogLevel::kWarn);
  const auto layout = dspine::dist::rank_layout();
  const auto device = dspine::dist::training_device(config.training.device, layout.local_rank);
  const auto source = data::make_batch_source(config, device);
  const data::ShardLayout shapes = data::shard_layout(config.data, config.model);
  if (layout.world_size == 1) {
    data::write_shards(*source, config.data, shapes, args.out_dir, args.options);
  } else {
    const auto comm = dspine::dist::make_communicator(config.distributed, c10::kCPU);
    const std::string partial = data::partial_dir(args.out_dir);
    if (layout.rank == 0) data::start_shards(*source, args.out_dir, args.options);
    comm->barrier();
    data::write_rank_shards(*source, shapes, partial, args.options, layout.rank, layout.world_size);
    comm->barrier();
    if (layout.rank == 0) {
      data::finish_shards(config.data, shapes, partial, args.out_dir, args.options);
    }
  }
  if (layout.rank != 0) return;
  fmt::print(
      "wrote {} samples from data.source {} (seq_len {}, hidden_size {}, {} target layers, "
      "{}, {} rank{}) to {}\n",
      args.options.num_samples, core::to_string(config.data.source), config.data.seq_len,
      config.model.hidden_size, config.model.target_layer_ids.size(), args.options.dtype,
      layout.world_size, layout.world_size > 1 ? "s" : "", args.out_dir);
}

void inspect(const std::string& dir, int64_t samples) {
  const data::ShardIndex index = data::read_shard_index(dir);
  const data::ShardLayout& layout = index.layout;
  data::ShardReader reader(dir, layout);  // checks the shard files before anything is printed
  const int64_t k = static_cast<int64_t>(layout.target_layer_ids.size());
  fmt::print("{}: {} shards, {} samples, dtype {}\n", dir, index.shards.size(), index.num_samples,
             index.dtype);
  fmt::print("  seq_len {}, hidden_size {}, vocab_size {}, target_layer_ids [{}]\n", layout.seq_len,
             layout.hidden_size, layout.vocab_size, fmt::join(layout.target_layer_ids, ", "));
  fmt::print("  per sample: input_ids [{}], loss_mask [{}], hidden_states [{}, {}], "
             "target_last_hidden_states [{}, {}]\n", layout.seq_len, layout.seq_len,
             layout.seq_len, k * layout.hidden_size, layout.seq_len, layout.hidden_size);

  // The teacher distribution a draft learns: softmax(target_last_hidden_states @ lm_headᵀ).
  const int64_t rows = std::min(samples, index.num_samples);
  const data::DraftBatch batch = reader.next(rows);
  const auto probs = torch::softmax(torch::matmul(batch.target_last_hidden_states,
                                                  reader.lm_head().t()), -1);
  const auto top = std::get<0>(probs.max(-1));
  const auto entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1);
  const auto supervised = batch.loss_mask.to(torch::kBool);
  fmt::print("  first {} samples: mean top-1 probability {:.3f}, entropy {:.3f} ± {:.3f} nats, "
             "{:.1f}% of positions supervised\n", rows, top.mean().item<double>(),
             entropy.mean().item<double>(), entropy.std().item<double>(),
             100.0 * supervised.to(torch::kDouble).mean().item<double>());
}

struct CheckArgs {
  std::vector<std::string> paths;
  std::string config_path;
  std::vector<std::string> overrides;
  int64_t vocab_size = 0;  // 0: the configuration's model.vocab_size
};

// Checks each path the way training does before its first step, timed: a file is token samples,
// a directory with index.json shards (against their own index), any other directory SpecForge
// samples (against the configuration's model.hidden_size and target_layer_ids). The rate counts
// the bytes of the files checked once each.
void check(const CheckArgs& args) {
  const core::Config config = dspine::train::load_run_config(args.config_path, args.overrides);
  data::ShardLayout layout = data::shard_layout(config.data, config.model);
  if (args.vocab_size > 0) layout.vocab_size = args.vocab_size;
  for (const std::string& path : args.paths) {
    const auto start = std::chrono::steady_clock::now();
    int64_t samples = 0, bytes = 0;
    std::string kind;
    if (fs::is_regular_file(path)) {
      kind = "token samples";
      samples = data::TokenSamples(path, layout.vocab_size).size();
      bytes = static_cast<int64_t>(fs::file_size(path));
    } else if (fs::is_regular_file(fs::path(path) / "index.json")) {
      kind = "shards";
      const data::ShardReader reader(path, data::read_shard_index(path).layout);
      samples = reader.distinct_samples();
      for (const auto& item : fs::directory_iterator(path)) {
        if (item.is_regular_file()) bytes += static_cast<int64_t>(item.file_size());
      }
    } else {
      kind = "SpecForge samples";
      const std::vector<std::string> files = data::list_specforge_samples(path);
      data::check_specforge_samples(files, layout);
      samples = static_cast<int64_t>(files.size());
      for (const std::string& file : files) bytes += static_cast<int64_t>(fs::file_size(file));
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print(stderr, "{}: {}, {} samples valid, {:.1f} MB in {:.2f} s ({:.0f} MB/s)\n", path,
               kind, samples, bytes / 1e6, seconds, bytes / 1e6 / std::max(seconds, 1e-9));
  }
}

void export_draft(const std::string& source, const std::string& out) {
  const auto summary = dspine::train::export_draft(source, out);
  fmt::print("exported {} ({} tensors, {}) to {}: config.json, model.safetensors, {}\n", source,
             summary.tensors, summary.dtype, out, dspine::train::kExportManifest);
}

struct RegenerateArgs {
  std::string target_dir, samples_file, out, device = "auto", dtype = "auto";
  int64_t samples = 0, offset = 0, prompt_tokens = 0, batch = 32;
  int64_t random_weights = -1;  // >= 0: seeded random weights of the target's shape (timing)
  dspine::decode::DecodeSettings decode;
  bool ignore_eos = false;
};

// The target continues each sample's prompt (docs/decoding.md, "Regeneration"); prints the
// throughput beside the weight bytes a decoding forward reads.
void regenerate(RegenerateArgs args) {
  const auto [device, dtype] = dspine::cli::decode_device(args.device, args.dtype);
  const auto target =
      args.random_weights >= 0
          ? dspine::target::Qwen3Model::random(
                dspine::target::read_qwen3_config((fs::path(args.target_dir) / "config.json").string()),
                static_cast<uint64_t>(args.random_weights), dtype, device)
          : dspine::target::Qwen3Model::load_hf(args.target_dir, dtype, device);
  data::TokenSamples samples(args.samples_file, target.dims().vocab_size, "--samples-file");
  const int64_t count = dspine::cli::samples_from(samples, args.offset, args.samples);
  if (!args.ignore_eos) args.decode.stop_tokens = dspine::decode::eos_token_ids(args.target_dir);
  const auto r = dspine::decode::regenerate(target, samples, args.offset, count,
                                            args.prompt_tokens, args.batch, args.decode, args.out);
  const double bytes =
      static_cast<double>(dspine::decode::decode_weight_bytes(target.dims(), dtype));
  fmt::print("regenerated {} samples into {}: {} prompt and {} generated tokens in {:.2f} s, "
             "{:.1f} tok/s (batch {}, temperature {}); {} forwards, {:.1f} MB of weights each, "
             "{:.1f} GB/s of weights read\n",
             r.samples, args.out, r.prompt_tokens, r.generated_tokens, r.seconds,
             r.seconds > 0 ? r.generated_tokens / r.seconds : 0.0, args.batch,
             args.decode.temperature, r.forwards, bytes / 1e6,
             r.seconds > 0 ? r.forwards * bytes / r.seconds / 1e9 : 0.0);
}

// CLI11's PositiveNumber answers -3 with a range up to a 309-digit number.
const CLI::Validator kAtLeastOne(
    [](std::string& value) {
      char* end = nullptr;
      const long long number = std::strtoll(value.c_str(), &end, 10);
      return end != value.c_str() && *end == '\0' && number >= 1
                 ? std::string()
                 : "must be an integer >= 1, got " + value;
    },
    "INT>=1");

}  // namespace

// The `regenerate` subcommand's options, into `args`.
CLI::App* add_regenerate_command(CLI::App& app, RegenerateArgs& args) {
  auto* command = app.add_subcommand(
      "regenerate", "continue each token sample's prompt with the target alone and write token "
                    "samples: the prompt unsupervised, the target's continuation supervised");
  command->add_option("--target", args.target_dir, "Hugging Face Qwen3 directory")
      ->required()
      ->check(CLI::ExistingDirectory);
  command->add_option("--samples-file", args.samples_file,
                      "token-sample JSONL whose prompts are continued (the tokens before "
                      "each sample's first supervised one)")
      ->required()
      ->check(CLI::ExistingFile);
  command->add_option("--out", args.out, "output JSONL (must not exist)")->required();
  command->add_option("--samples", args.samples, "samples (default: all from --offset)")
      ->check(kAtLeastOne);
  command->add_option("--offset", args.offset, "index of the first sample")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--prompt-tokens", args.prompt_tokens,
                      "prompt = each sample's first N tokens instead")
      ->check(kAtLeastOne);
  command->add_option("--max-new-tokens", args.decode.max_new_tokens,
                      "tokens generated per sample at most")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  command->add_option("--temperature", args.decode.temperature, "0: greedy")
      ->check(CLI::Range(0.0, 1e4))
      ->capture_default_str();
  command->add_option("--seed", args.decode.seed, "seed of the draws at temperature > 0");
  command->add_option("--batch", args.batch, "samples decoded together")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}))
      ->capture_default_str();
  command->add_option("--device", args.device, "auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  command->add_option("--dtype", args.dtype,
                      "auto (bf16 on CUDA, fp32 on the CPU), fp32 or bf16")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}));
  command->add_flag("--ignore-eos", args.ignore_eos,
                    "generate --max-new-tokens whatever the tokens");
  command->add_option("--random-weights", args.random_weights,
                      "seeded random weights of --target's config.json shape instead of its "
                      "checkpoint (for timing)")
      ->check(CLI::NonNegativeNumber);
  return command;
}

int main(int argc, char** argv) {
  CLI::App app{"dspine-data: target-model training data as safetensors shards, data checks; "
               "draft export"};
  app.require_subcommand(1);

  GenerateArgs gen;
  auto* generate_cmd = app.add_subcommand(
      "generate", "run a target (the synthetic one, or a real Qwen3 with --target) over samples "
                  "and write its hidden states as shards");
  generate_cmd->add_option("--config", gen.config_path,
                           "run configuration YAML (default: the embedded configuration)");
  generate_cmd->add_option("--set", gen.overrides, "override a key: section.key=value (repeatable)");
  generate_cmd->add_option("--out", gen.out_dir, "output directory (must not exist)")->required();
  generate_cmd->add_option("--target", gen.target_dir,
                           "Hugging Face Qwen3 directory to run instead of the synthetic target "
                           "(data.source=target, data.target.path)");
  generate_cmd->add_option("--samples-file", gen.samples_file,
                           "token-sample JSONL the target reads (data.samples; from "
                           "scripts/prepare_data.py)");
  generate_cmd->add_option("--samples", gen.options.num_samples, "number of samples")
      ->check(kAtLeastOne)
      ->capture_default_str();
  generate_cmd->add_option("--samples-per-shard", gen.options.samples_per_shard,
                           "samples in each shard file")
      ->check(kAtLeastOne)
      ->capture_default_str();
  generate_cmd->add_option("--dtype", gen.options.dtype, "storage of the hidden states")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();

  std::string inspect_dir;
  int64_t inspect_samples = 8;
  auto* inspect_cmd = app.add_subcommand("inspect", "summarize a shard directory");
  inspect_cmd->add_option("dir", inspect_dir, "shard directory")->required();
  inspect_cmd->add_option("--samples", inspect_samples, "samples to measure the target on")
      ->check(kAtLeastOne)
      ->capture_default_str();

  CheckArgs check_args;
  auto* check_cmd = app.add_subcommand(
      "check", "check token-sample files, shard directories or SpecForge sample directories in "
               "full, as training does before step 1; prints samples and MB/s to stderr");
  check_cmd->add_option("paths", check_args.paths,
                        "token-sample JSONL file, shard directory (index.json) or SpecForge "
                        "sample directory")
      ->required();
  check_cmd->add_option("--config", check_args.config_path,
                        "run configuration YAML for model.vocab_size, model.hidden_size and "
                        "model.target_layer_ids (default: the embedded configuration)");
  check_cmd->add_option("--set", check_args.overrides,
                        "override a key: section.key=value (repeatable)");
  check_cmd->add_option("--vocab-size", check_args.vocab_size,
                        "token ids must lie in [0, N) (default: model.vocab_size)")
      ->check(kAtLeastOne);

  std::string export_source, export_out;
  auto* export_cmd = app.add_subcommand(
      "export", "write a trained DSpine draft in the Hugging Face layout (config.json, "
                "model.safetensors) that SpecForge and serving engines read");
  export_cmd->add_option("checkpoint", export_source, "checkpoint directory (or an export)")
      ->required();
  export_cmd->add_option("out", export_out, "output directory (must not exist)")->required();

  RegenerateArgs regen;
  auto* regenerate_cmd = add_regenerate_command(app, regen);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return dspine::cli::exit_on_usage_error(app, e);
  }
  dspine::dist::MpiContext mpi(&argc, &argv);
  try {
    if (*generate_cmd) generate(gen, mpi);
    if (*inspect_cmd) inspect(inspect_dir, inspect_samples);
    if (*check_cmd) check(check_args);
    if (*export_cmd) export_draft(export_source, export_out);
    if (*regenerate_cmd) regenerate(regen);
  } catch (const std::exception& e) {
    return mpi.fail_run(e);
  }
  return 0;
}
