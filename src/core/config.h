// Typed run configuration. YAML is parsed and validated in config.cpp only; the rest of the code
// receives these structs. Sections: model, data, training, objective, checkpoint, logging,
// distributed. Every key is validated (type, range, allowed values); unknown keys are errors.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "core/log_level.h"
#include "core/settings.h"

namespace dspine::core {

// The closed choices of the configuration (core/settings.h: Choice, to_string; LogLevel in
// core/log_level.h). A new choice is one enumerator and one entry in its choices_of table.
enum class Device { kAuto, kCpu, kCuda };
enum class Dtype { kFp32, kBf16 };
enum class Sharding { kNone, kZero2, kZero3 };
enum class CommBackend { kAuto, kMpi, kNccl };
enum class DataSource { kSynthetic, kShards, kRandom, kTarget, kSpecforge };
enum class FusedKernels { kAuto, kOn, kOff };
enum class LrScheduler { kCosine, kConstant };
enum class OnNonfinite { kSkip, kStop };
enum class ProgressMode { kAuto, kOn, kOff };

// Each table lists every enumerator, in the order the allowed values are shown.
constexpr std::array<Choice<Device>, 3> choices_of(Device) {
  return {{{Device::kAuto, "auto"}, {Device::kCpu, "cpu"}, {Device::kCuda, "cuda"}}};
}
constexpr std::array<Choice<Dtype>, 2> choices_of(Dtype) {
  return {{{Dtype::kFp32, "fp32"}, {Dtype::kBf16, "bf16"}}};
}
constexpr std::array<Choice<Sharding>, 3> choices_of(Sharding) {
  return {{{Sharding::kNone, "none"}, {Sharding::kZero2, "zero2"}, {Sharding::kZero3, "zero3"}}};
}
constexpr std::array<Choice<CommBackend>, 3> choices_of(CommBackend) {
  return {{{CommBackend::kAuto, "auto"}, {CommBackend::kMpi, "mpi"}, {CommBackend::kNccl, "nccl"}}};
}
constexpr std::array<Choice<DataSource>, 5> choices_of(DataSource) {
  return {{{DataSource::kSynthetic, "synthetic"},
           {DataSource::kShards, "shards"},
           {DataSource::kRandom, "random"},
           {DataSource::kTarget, "target"},
           {DataSource::kSpecforge, "specforge"}}};
}
constexpr std::array<Choice<FusedKernels>, 3> choices_of(FusedKernels) {
  return {
      {{FusedKernels::kAuto, "auto"}, {FusedKernels::kOn, "true"}, {FusedKernels::kOff, "false"}}};
}
constexpr std::array<Choice<LrScheduler>, 2> choices_of(LrScheduler) {
  return {{{LrScheduler::kCosine, "cosine"}, {LrScheduler::kConstant, "constant"}}};
}
constexpr std::array<Choice<OnNonfinite>, 2> choices_of(OnNonfinite) {
  return {{{OnNonfinite::kSkip, "skip"}, {OnNonfinite::kStop, "stop"}}};
}
constexpr std::array<Choice<ProgressMode>, 3> choices_of(ProgressMode) {
  return {
      {{ProgressMode::kAuto, "auto"}, {ProgressMode::kOn, "true"}, {ProgressMode::kOff, "false"}}};
}
constexpr std::array<Choice<LogLevel>, 5> choices_of(LogLevel) {
  return {{{LogLevel::kTrace, "trace"},
           {LogLevel::kDebug, "debug"},
           {LogLevel::kInfo, "info"},
           {LogLevel::kWarn, "warn"},
           {LogLevel::kError, "error"}}};
}

// The draft model. hidden_size / vocab_size are shared with the target (frozen embedding and
// lm_head come from it); target_layer_ids says which target layers feed hidden_states (K of them).
struct ModelConfig {
  // simple | dspine. A string, not an enum: it names an entry of the draft registry
  // (model/draft_registry.h), which core does not know.
  std::string architecture = "simple";
  int64_t hidden_size = 64;
  int64_t intermediate_size = 128;
  int64_t num_hidden_layers = 2;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 2;
  int64_t head_dim = 16;
  int64_t vocab_size = 256;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double initializer_range = 0.02;
  int64_t block_size = 4;
  int64_t mask_token_id = -1;  // -1: the last vocabulary id
  std::vector<int64_t> target_layer_ids = {0, 1, 2};
  // Decoder layers of the target (config.json's num_target_layers); 0 = the data source's own:
  // the target's config.json, or data.synthetic.num_layers (data/target_depth.h).
  int64_t num_target_layers = 0;
  FusedKernels fused_kernels = FusedKernels::kAuto;
  // An architecture's own settings are the map model.<architecture>: Config::sections.
};

// The embedded synthetic target: a few Qwen3-style layers with seeded random weights.
struct SyntheticTargetConfig {
  int64_t seed = 1234;
  int64_t num_layers = 4;  // must exceed every model.target_layer_ids entry
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 2;
  int64_t head_dim = 16;
  int64_t intermediate_size = 128;
  double logit_scale = 1.0;     // multiplies the target's logits; folded into its lm_head()
  double temperature = 1.0;     // sampling temperature
  int64_t prompt_length = 8;    // leading tokens with loss_mask 0 (the "prompt")
};

// A real Qwen3 target run online (data.source: target; docs/data.md).
struct TargetModelConfig {
  std::string path;     // Hugging Face Qwen3 directory (config.json and safetensors weights)
  bool random = false;  // weights seeded from `seed` in the shape of path/config.json (benchmarks)
  int64_t seed = 0;
  // Compute the next window's batches ahead, on CUDA on a stream of their own while the draft
  // trains on this window's (docs/data.md, "Online target").
  bool prefetch = true;
};

struct DataConfig {
  // synthetic | shards | random (seeded values of the configured shapes on the training device,
  // for benchmarks; uses synthetic.seed and synthetic.prompt_length) | target (a Qwen3 model run
  // on token samples) | specforge (a directory of SpecForge offline samples)
  DataSource source = DataSource::kSynthetic;
  std::string shards_dir;            // directory written by `dspine-data generate`
  std::string samples;               // token-sample JSONL (scripts/prepare_data.py) for target
  std::string specforge_dir;         // SpecForge's torch.save samples, one file each
  int64_t seq_len = 64;
  // Held-out samples of the acceptance evaluation (training.eval_every, dspine-eval --acceptance):
  // eval_samples from global index eval_offset of the held-out source; -1 = index 0 of a separate
  // held-out file, else the first sample past the run's training data (docs/evaluation.md).
  int64_t eval_samples = 64;
  int64_t eval_offset = -1;
  // A separate held-out source of the training source's kind ("" = the training source itself).
  std::string eval_samples_file;   // token-sample JSONL (target)
  std::string eval_shards_dir;     // shard directory (shards)
  std::string eval_specforge_dir;  // SpecForge samples (specforge)
  SyntheticTargetConfig synthetic;
  TargetModelConfig target;
};

struct TrainingConfig {
  int64_t batch_size = 2;          // rows per micro-batch per rank
  int64_t accumulation_steps = 1;  // micro-batches per optimizer step
  int64_t total_steps = 100;       // optimizer steps
  double learning_rate = 1e-3;     // alias: lr
  LrScheduler lr_scheduler = LrScheduler::kCosine;
  double warmup_ratio = 0.04;
  double max_grad_norm = 1.0;      // 0 disables clipping
  double weight_decay = 0.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  int64_t seed = 42;
  Dtype dtype = Dtype::kFp32;  // parameter/compute dtype (masters stay fp32)
  Device device = Device::kAuto;
  // Intra-op CPU threads (0 = LibTorch's default). Small models run fastest on 1: MKL's threads
  // spin-wait between tiny GEMMs.
  int64_t cpu_threads = 0;
  // CUDA runs use deterministic algorithms (LibTorch's deterministic mode, a fixed cuBLAS
  // workspace), so that a run and its resumed copy agree bitwise; false trades that for speed.
  bool deterministic = true;
  // A step whose loss or gradient is not finite (on any rank) is never applied: skip drops it
  // and trains on, stop saves the state before it and ends the run with an error.
  OnNonfinite on_nonfinite = OnNonfinite::kSkip;
  // Optimizer steps between acceptance evaluations (and one at the end); 0 = off.
  int64_t eval_every = 0;
  // The evaluation also decodes each held-out row's prompt for this many tokens with the draft
  // and the online target (τ in real decoding, docs/evaluation.md); 0 = text τ only.
  int64_t eval_decode_tokens = 0;
  int64_t eval_decode_prompt_tokens = 0;  // a prompt: a row's first N ids; 0: before supervision
  double eval_decode_temperature = 0.0;   // 0: greedy
  // A checkpoint or export directory (or a draft .safetensors) whose weights a fresh run starts
  // from, with a fresh optimizer, schedule and data position; "" = initialise the draft.
  std::string init_from;
};

// The objective is chosen by name from the trainer's registry (train/objective_registry.h), which
// core does not know; its settings are the map objective.<name>: Config::sections.
struct ObjectiveConfig {
  std::string name = "ce";
};

struct CheckpointConfig {
  std::string dir = "runs/default/checkpoints";
  int64_t save_every = 0;  // optimizer steps between saves; 0 = only the final save
  int64_t keep_last = 3;   // complete checkpoints kept; 0 = keep all
  std::string resume = "none";  // none | auto | <checkpoint directory>
};

struct LoggingConfig {
  int64_t every = 10;  // optimizer steps between metric records
  std::string metrics_file = "runs/default/metrics.jsonl";  // "" = no file
  ProgressMode progress = ProgressMode::kAuto;              // auto: only on a terminal
  LogLevel level = LogLevel::kInfo;
};

// How ranks talk and how the draft's parameters are split over them (docs/distributed.md).
struct DistributedConfig {
  CommBackend backend = CommBackend::kAuto;  // auto: NCCL for CUDA, MPI for CPU
  Sharding sharding = Sharding::kNone;       // none: data parallel
  double timeout_s = 600;         // a collective not done by then ends every rank
  bool prefetch = true;           // zero3: gather the next unit while the current one runs
};

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainingConfig training;
  ObjectiveConfig objective;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  DistributedConfig distributed;
  // The maps of the catalog parse_config was given (an objective's objective.<name>, an
  // architecture's model.<name>), typed, by full key ("objective.gspo").
  std::map<std::string, SectionValue> sections;
  std::string source;  // names the parsed text in error messages (set by parse_config)
  // The --set text that gave a key, by full key: errors the registries raise about a key end
  // with "(from override '<text>')" as core's own do.
  std::map<std::string, std::string> overrides;

  // The settings of the map `map`: the parsed ones, or the defaults of S when the configuration
  // holds no such map (one built in code). Throws when the map holds another type.
  template <typename S>
  const S& section(const std::string& map) const;
  template <typename S>
  void set_section(const std::string& map, S value) {
    sections.insert_or_assign(map,
                              SectionValue(std::make_unique<TypedSection<S>>(std::move(value))));
  }
};

[[noreturn]] void section_type_error(const std::string& map);

template <typename S>
const S& Config::section(const std::string& map) const {
  static const S defaults{};
  const auto found = sections.find(map);
  if (found == sections.end()) return defaults;
  const auto* typed = dynamic_cast<const TypedSection<S>*>(&found->second.get());
  if (typed == nullptr) section_type_error(map);
  return typed->value;
}

// The YAML text of configs/tiny.yaml, compiled in (what dspine-train runs without --config).
extern const char* const kEmbeddedDefaultConfig;

// Parses YAML text into a validated Config. `source` names the text in error messages.
// `overrides` are "section.key=value" strings (value parsed as YAML), applied before validation.
// `catalog` lists the maps beyond core's (train/run_config.h has the trainer's); each is read
// and checked as core's own, and held in Config::sections with its defaults when absent. Keys
// absent from the YAML keep their defaults. Keys moved to objective.dspine are still read under
// their old names (with a warning naming the new key). Every rule is checked here, once. Throws
// dspine::Error naming the key, the bad value and what is allowed; unknown keys get a "did you
// mean".
Config parse_config(const std::string& yaml_text, const std::string& source,
                    const std::vector<std::string>& overrides = {},
                    const SectionCatalog& catalog = {});

// Reads `path` (error naming the file if missing/unreadable), or the embedded default when empty.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {},
                   const SectionCatalog& catalog = {});

// Samples a run of `world_size` ranks reads in training.total_steps steps (global indices 0 up).
int64_t training_rows(const Config& config, int64_t world_size);

// First held-out sample of the acceptance evaluation: data.eval_offset, or for -1 index 0 of a
// separate held-out source (data.eval_*), else the sample right past the training data.
int64_t eval_offset(const Config& config, int64_t world_size);

// Serializes every key (the resolved configuration, its sections' included) as YAML;
// parse_config(to_yaml(c), ..., catalog) == c.
std::string to_yaml(const Config& config);

// Every key of the configuration with its value as to_yaml writes it (typed values compare equal
// exactly when these texts do), by full key.
std::map<std::string, std::string> setting_values(const Config& config);

// One settable key as the configuration reference (docs/config.md) shows it. Generated from the
// key table and the validation itself, so the reference cannot drift from what is accepted.
struct KeyFacts {
  std::string key;            // full dotted name
  std::string type;           // integer | number | string | boolean | list of integers
  std::string default_value;  // YAML text of the default
  std::string allowed;        // the choices, or the rule validation enforces ("" = any value)
  std::string description;    // from the key's declaration
};

// The draft architectures model.architecture accepts; each may have a kept map model.<name>.
const std::vector<std::string>& architecture_names();

// Every key of the sections above (not the maps of the catalog), in to_yaml order.
std::vector<KeyFacts> core_key_facts();

// Every key of the catalog's maps, in catalog order, with their defaults.
std::vector<KeyFacts> section_key_facts(const SectionCatalog& catalog);

}  // namespace dspine::core
