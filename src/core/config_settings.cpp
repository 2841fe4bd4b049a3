// Core's sections, one declaration per key: key, member, rule and description (the default is the
// member's initial value in config.h). Adding a key: the member in config.h, one line here.
#include "core/config_settings.h"

#include <fmt/format.h>

namespace dspine::core {
namespace {

// `heads` (>= 1 by its own rule) must be a multiple of `kv_heads` (grouped-query attention).
Rule heads_rule(const int64_t& heads, const int64_t& kv_heads, const std::string& kv_key) {
  return rule("integer >= 1, a multiple of " + kv_key, [&heads, &kv_heads, kv_key](auto& key) {
    std::optional<RuleFailure> failure;
    if (heads < 1) {
      failure = out_of_range(key, shown(heads), "integer >= 1");
    } else if (kv_heads >= 1 && heads % kv_heads != 0) {
      failure =
          out_of_range(key, shown(heads), fmt::format("a multiple of {} = {}", kv_key, kv_heads));
    }
    return failure;
  });
}

Rule mask_token_rule(const ModelConfig& m) {
  return rule("-1 (the last vocabulary id) or an id in [0, model.vocab_size)", [&m](auto& key) {
    std::optional<RuleFailure> failure;
    if (m.mask_token_id < -1 || m.mask_token_id >= m.vocab_size) {
      failure = out_of_range(
          key, shown(m.mask_token_id),
          fmt::format("-1 (the last vocabulary id) or an id in [0, model.vocab_size = {})",
                      m.vocab_size));
    }
    return failure;
  });
}

// Each id a layer of the target: below model.num_target_layers when given, and below the
// synthetic target's depth when the data come from it.
Rule target_layers_rule(const Config& c) {
  return rule(
      "at least one layer id >= 0; with data.source synthetic, each < data.synthetic.num_layers",
      [&c](auto& key) -> std::optional<RuleFailure> {
        const ModelConfig& m = c.model;
        if (m.target_layer_ids.empty()) {
          return bad_value(key, "[]", "must list at least one target layer");
        }
        const bool synthetic = c.data.source == DataSource::kSynthetic;
        for (size_t i = 0; i < m.target_layer_ids.size(); ++i) {
          const int64_t id = m.target_layer_ids[i];
          const std::string item = fmt::format("{}[{}]", key, i);
          if (id < 0) return out_of_range(item, shown(id), "integer >= 0");
          if (m.num_target_layers > 0 && id >= m.num_target_layers) {
            return out_of_range(
                item, shown(id),
                fmt::format("a layer of the target, in [0, model.num_target_layers = {})",
                            m.num_target_layers));
          }
          if (synthetic && id >= c.data.synthetic.num_layers) {
            return out_of_range(item, shown(id),
                                fmt::format("a layer of the synthetic target, in [0, "
                                            "data.synthetic.num_layers = {})",
                                            c.data.synthetic.num_layers));
          }
        }
        return std::nullopt;
      });
}

Settings model_settings(ModelConfig& m, const Config& c) {
  return {
      {"architecture", &m.architecture, documented(""),
       "the draft: DSpine, or a minimal next-token draft for tests", architecture_choices()},
      {"hidden_size", &m.hidden_size, at_least(m.hidden_size, 1),
       "H, shared with the target (its embedding and lm_head)"},
      {"intermediate_size", &m.intermediate_size, at_least(m.intermediate_size, 1),
       "SwiGLU width of each draft layer"},
      {"num_hidden_layers", &m.num_hidden_layers, at_least(m.num_hidden_layers, 1),
       "draft decoder layers L"},
      {"num_attention_heads", &m.num_attention_heads,
       heads_rule(m.num_attention_heads, m.num_key_value_heads, "model.num_key_value_heads"),
       "query heads"},
      {"num_key_value_heads", &m.num_key_value_heads, at_least(m.num_key_value_heads, 1),
       "key/value heads (grouped-query attention)"},
      {"head_dim", &m.head_dim, at_least(m.head_dim, 1), "width of one attention head"},
      {"vocab_size", &m.vocab_size, at_least(m.vocab_size, 1), "V, shared with the target"},
      {"rms_norm_eps", &m.rms_norm_eps, positive(m.rms_norm_eps), "epsilon of every RMSNorm"},
      {"rope_theta", &m.rope_theta, positive(m.rope_theta), "RoPE base"},
      {"initializer_range", &m.initializer_range, nonnegative(m.initializer_range),
       "std of the normal initialisation of the backbone"},
      {"block_size", &m.block_size, at_least(m.block_size, 2),
       "tokens per block: the anchor and block_size - 1 proposals"},
      {"mask_token_id", &m.mask_token_id, mask_token_rule(m),
       "token whose embedding fills the proposal slots"},
      {"target_layer_ids", &m.target_layer_ids, target_layers_rule(c),
       "target layers (0-based) whose outputs the draft reads"},
      {"num_target_layers", &m.num_target_layers, at_least(m.num_target_layers, 0),
       "the target's depth in config.json; 0 = from the target's config.json or data.synthetic"},
      {"fused_kernels",
       choice_target(&m.fused_kernels),
       {},
       "fused CUDA kernels: RMSNorm/SwiGLU, q/k norm + RoPE, block attention (bf16), injection "
       "residual, alignment cosine, vocabulary objective (auto: on CUDA devices); the fused AdamW "
       "step (auto: everywhere); false also keeps an online target on HF's ATen composition",
       {},
       true},
  };
}

// A path the data source needs: `needed` says when, `problem` what the error says.
Rule needed_path(const std::string& value, std::string allowed, std::function<bool()> needed,
                 std::function<std::string()> problem) {
  return rule(std::move(allowed), [&value, needed, problem](auto& key) {
    std::optional<RuleFailure> failure;
    if (value.empty() && needed()) failure = bad_value(key, shown(value), problem());
    return failure;
  });
}

// A separate held-out source must be of the training source's kind: it is read through the same
// target (data/batch_source.h, make_held_out_source).
Rule held_out_rule(const std::string& value, const DataConfig& data, DataSource source,
                   const char* what) {
  return rule(fmt::format("\"\" or, with data.source {}, a held-out {}", to_string(source), what),
              [&value, &data, source](auto& key) {
                std::optional<RuleFailure> failure;
                if (!value.empty() && data.source != source) {
                  failure =
                      bad_value(key, shown(value),
                                fmt::format("data.source is {}; this key is for data.source {}",
                                            to_string(data.source), to_string(source)));
                }
                return failure;
              });
}

Settings synthetic_settings(SyntheticTargetConfig& s, const DataConfig& data) {
  return {
      {"seed", &s.seed, at_least(s.seed, 0), "seed of the synthetic target's weights and samples"},
      {"num_layers", &s.num_layers, at_least(s.num_layers, 1),
       "decoder layers of the synthetic target"},
      {"num_attention_heads", &s.num_attention_heads,
       heads_rule(s.num_attention_heads, s.num_key_value_heads,
                  "data.synthetic.num_key_value_heads"),
       "synthetic target's query heads"},
      {"num_key_value_heads", &s.num_key_value_heads, at_least(s.num_key_value_heads, 1),
       "synthetic target's key/value heads"},
      {"head_dim", &s.head_dim, at_least(s.head_dim, 1), "synthetic target's head width"},
      {"intermediate_size", &s.intermediate_size, at_least(s.intermediate_size, 1),
       "synthetic target's SwiGLU width"},
      {"logit_scale", &s.logit_scale, positive(s.logit_scale),
       "multiplies the synthetic target's logits"},
      {"temperature", &s.temperature, positive(s.temperature),
       "temperature the synthetic target samples at"},
      {"prompt_length", &s.prompt_length,
       rule("integer in [0, data.seq_len)",
            [&s, &data](auto& key) {
              std::optional<RuleFailure> failure;
              if (s.prompt_length < 0 || s.prompt_length >= data.seq_len) {
                failure =
                    out_of_range(key, shown(s.prompt_length),
                                 fmt::format("integer in [0, data.seq_len = {})", data.seq_len));
              }
              return failure;
            }),
       "leading tokens of a sample without loss"},
  };
}

Settings target_settings(TargetModelConfig& t, const DataConfig& data) {
  return {
      {"path", &t.path,
       needed_path(
           t.path, "a Hugging Face Qwen3 directory; needed by target and specforge",
           [&data] {
             return data.source == DataSource::kTarget || data.source == DataSource::kSpecforge;
           },
           [&data] {
             return fmt::format(
                 "data.source is {}, which needs the target's Hugging Face "
                 "directory",
                 to_string(data.source));
           }),
       "the target's Hugging Face directory (config.json, weights)"},
      {"random", &t.random, {}, "seeded random weights of config.json's shape (benchmarks)"},
      {"seed", &t.seed, at_least(t.seed, 0),
       "seed of the random target weights and random token ids"},
      {"prefetch",
       &t.prefetch,
       {},
       "compute the next window's batches ahead (CUDA: on their own stream, overlapping training)"},
  };
}

Settings data_settings(DataConfig& d) {
  Settings settings = {
      {"source", choice_target(&d.source), {}, "where batches come from (docs/data.md)"},
      {"shards_dir", &d.shards_dir,
       needed_path(
           d.shards_dir,
           "a directory written by dspine-data generate; needed when data.source is shards",
           [&d] { return d.source == DataSource::kShards; },
           [] {
             return std::string(
                 "data.source is shards, which needs the directory written by dspine-data "
                 "generate");
           }),
       "shard directory written by dspine-data generate"},
      {"samples", &d.samples,
       needed_path(
           d.samples, "a token-sample JSONL file; needed by target unless target.random",
           [&d] { return d.source == DataSource::kTarget && !d.target.random; },
           [] {
             return std::string(
                 "data.source is target, which needs a token-sample JSONL file (random token ids "
                 "only with data.target.random: true)");
           }),
       "token-sample JSONL the online target reads (docs/data.md)"},
      {"specforge_dir", &d.specforge_dir,
       needed_path(
           d.specforge_dir, "a directory of SpecForge samples; needed by specforge",
           [&d] { return d.source == DataSource::kSpecforge; },
           [] {
             return std::string(
                 "data.source is specforge, which needs a directory of SpecForge samples");
           }),
       "SpecForge's offline samples, one torch.save file each"},
      {"seq_len", &d.seq_len, at_least(d.seq_len, 2), "tokens per sample"},
      {"eval_samples", &d.eval_samples, at_least(d.eval_samples, 1),
       "held-out samples of the acceptance evaluation"},
      {"eval_offset", &d.eval_offset,
       rule("integer >= 0, or -1 for the first sample past the training data",
            [&d](auto& key) {
              std::optional<RuleFailure> failure;
              if (d.eval_offset < -1) {
                failure =
                    out_of_range(key, shown(d.eval_offset),
                                 "integer >= 0, or -1 for the first sample past the training data");
              }
              return failure;
            }),
       "index of the first held-out sample"},
      {"eval_samples_file", &d.eval_samples_file,
       held_out_rule(d.eval_samples_file, d, DataSource::kTarget, "token-sample JSONL file"),
       "held-out token samples, never trained on (docs/evaluation.md)"},
      {"eval_shards_dir", &d.eval_shards_dir,
       held_out_rule(d.eval_shards_dir, d, DataSource::kShards, "shard directory"),
       "held-out shard directory, never trained on"},
      {"eval_specforge_dir", &d.eval_specforge_dir,
       held_out_rule(d.eval_specforge_dir, d, DataSource::kSpecforge, "SpecForge sample directory"),
       "held-out SpecForge samples, never trained on"},
  };
  for (Settings part : {under("synthetic", synthetic_settings(d.synthetic, d)),
                        under("target", target_settings(d.target, d))}) {
    settings.insert(settings.end(), part.begin(), part.end());
  }
  return settings;
}

Settings training_settings(TrainingConfig& t) {
  return {
      {"batch_size", &t.batch_size, at_least(t.batch_size, 1), "rows per micro-batch per rank"},
      {"accumulation_steps", &t.accumulation_steps, at_least(t.accumulation_steps, 1),
       "micro-batches per optimizer step"},
      {"total_steps", &t.total_steps, at_least(t.total_steps, 1),
       "optimizer steps of the run (the schedules' horizon)"},
      {"learning_rate", &t.learning_rate, positive(t.learning_rate),
       "AdamW learning rate (alias training.lr)"},
      {"lr_scheduler",
       choice_target(&t.lr_scheduler),
       {},
       "linear warmup then cosine to 0, or constant"},
      {"warmup_ratio", &t.warmup_ratio, fraction(t.warmup_ratio),
       "share of total_steps spent warming up"},
      {"max_grad_norm", &t.max_grad_norm, nonnegative(t.max_grad_norm),
       "global gradient-norm clip; 0 disables"},
      {"weight_decay", &t.weight_decay, nonnegative(t.weight_decay), "AdamW weight decay"},
      {"adam_beta1", &t.adam_beta1, fraction(t.adam_beta1), "AdamW beta1"},
      {"adam_beta2", &t.adam_beta2, fraction(t.adam_beta2), "AdamW beta2"},
      {"adam_eps", &t.adam_eps, positive(t.adam_eps), "AdamW epsilon"},
      {"seed", &t.seed, at_least(t.seed, 0), "seed of initialisation, anchors and sampling"},
      {"dtype", choice_target(&t.dtype), {}, "parameter and compute dtype (masters stay fp32)"},
      {"device", choice_target(&t.device), {}, "auto: CUDA when present"},
      {"cpu_threads", &t.cpu_threads, at_least(t.cpu_threads, 0),
       "intra-op CPU threads; 0 = LibTorch's default"},
      {"deterministic",
       &t.deterministic,
       {},
       "CUDA: deterministic algorithms, so that resumed runs are bitwise (docs/model.md)"},
      {"on_nonfinite",
       choice_target(&t.on_nonfinite),
       {},
       "a NaN/inf step: skip it, or save and stop"},
      {"eval_every", &t.eval_every, at_least(t.eval_every, 0),
       "steps between acceptance evaluations; 0 = off"},
      {"eval_decode_tokens", &t.eval_decode_tokens, at_least(t.eval_decode_tokens, 0),
       "each evaluation also decodes every held-out prompt for N tokens with the draft and the "
       "online target (tau in real decoding); 0 = off"},
      {"eval_decode_prompt_tokens", &t.eval_decode_prompt_tokens,
       at_least(t.eval_decode_prompt_tokens, 0),
       "prompt of that decoding: a held-out row's first N tokens; 0 = its tokens before the first "
       "supervised one"},
      {"eval_decode_temperature", &t.eval_decode_temperature,
       nonnegative(t.eval_decode_temperature), "temperature of that decoding; 0 = greedy"},
      {"init_from",
       &t.init_from,
       {},
       "checkpoint or export to take the draft's weights from (fresh optimizer and data)"},
  };
}

Settings run_settings(Config& c) {
  CheckpointConfig& k = c.checkpoint;
  LoggingConfig& l = c.logging;
  DistributedConfig& d = c.distributed;
  Settings settings = {
      {"objective.name",
       &c.objective.name,
       {},
       "the objective (and the map objective.<name> of its settings)"},
      {"checkpoint.dir", &k.dir, not_empty(k.dir), "where step-NNNNNN checkpoints go"},
      {"checkpoint.save_every", &k.save_every, at_least(k.save_every, 0),
       "steps between saves; 0 = only at the end"},
      {"checkpoint.keep_last", &k.keep_last, at_least(k.keep_last, 0),
       "complete checkpoints kept; 0 = all"},
      {"checkpoint.resume", &k.resume, not_empty(k.resume),
       "none, auto (newest valid checkpoint) or a checkpoint dir"},
      {"logging.every", &l.every, at_least(l.every, 1), "steps between metric records"},
      {"logging.metrics_file", &l.metrics_file, {}, "JSON-lines metrics; \"\" = none"},
      {"logging.progress",
       choice_target(&l.progress),
       {},
       "progress line (auto: on a terminal)",
       {},
       true},
      {"logging.level", choice_target(&l.level), {}, "log level"},
      {"distributed.backend",
       choice_target(&d.backend),
       {},
       "auto: NCCL for CUDA tensors, MPI for CPU"},
      {"distributed.sharding",
       choice_target(&d.sharding),
       {},
       "data parallel, or ZeRO-2/3 style sharding"},
      {"distributed.timeout_s", &d.timeout_s, positive(d.timeout_s),
       "a collective not done by then ends every rank"},
      {"distributed.prefetch", &d.prefetch, {}, "zero3: gather the next unit while one runs"},
  };
  return settings;
}

}  // namespace

const std::vector<std::string>& architecture_choices() {
  static const std::vector<std::string> names = {"simple", "dspine"};
  return names;
}

Settings core_settings(Config& c) {
  Settings settings;
  for (Settings part :
       {under("model", model_settings(c.model, c)), under("data", data_settings(c.data)),
        under("training", training_settings(c.training)), run_settings(c)}) {
    settings.insert(settings.end(), part.begin(), part.end());
  }
  return settings;
}

}  // namespace dspine::core
