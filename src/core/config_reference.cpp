#include "core/config_reference.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "core/error.h"

namespace dspine::core {
namespace {

// One line per key of config.h; the struct comments say more.
const std::map<std::string, std::string>& core_descriptions() {
  static const std::map<std::string, std::string> descriptions = {
      {"model.architecture", "the draft: DSpine, or a minimal next-token draft for tests"},
      {"model.hidden_size", "H, shared with the target (its embedding and lm_head)"},
      {"model.intermediate_size", "SwiGLU width of each draft layer"},
      {"model.num_hidden_layers", "draft decoder layers L"},
      {"model.num_attention_heads", "query heads"},
      {"model.num_key_value_heads", "key/value heads (grouped-query attention)"},
      {"model.head_dim", "width of one attention head"},
      {"model.vocab_size", "V, shared with the target"},
      {"model.rms_norm_eps", "epsilon of every RMSNorm"},
      {"model.rope_theta", "RoPE base"},
      {"model.initializer_range", "std of the normal initialisation of the backbone"},
      {"model.block_size", "tokens per block: the anchor and block_size - 1 proposals"},
      {"model.mask_token_id", "token whose embedding fills the proposal slots"},
      {"model.target_layer_ids", "target layers (0-based) whose outputs the draft reads"},
      {"model.num_target_layers",
       "the target's depth in config.json; 0 = from the target's config.json or data.synthetic"},
      {"model.fused_kernels",
       "fused CUDA kernels: RMSNorm/SwiGLU, q/k norm + RoPE, block attention (bf16), injection "
       "residual, alignment cosine, vocabulary objective (auto: on CUDA devices); the fused AdamW "
       "step (auto: everywhere); false also keeps an online target on HF's ATen composition"},
      {"data.source", "where batches come from (docs/data.md)"},
      {"data.shards_dir", "shard directory written by dspine-data generate"},
      {"data.samples", "token-sample JSONL the online target reads (docs/data.md)"},
      {"data.specforge_dir", "SpecForge's offline samples, one torch.save file each"},
      {"data.seq_len", "tokens per sample"},
      {"data.eval_samples", "held-out samples of the acceptance evaluation"},
      {"data.eval_offset", "index of the first held-out sample"},
      {"data.eval_samples_file", "held-out token samples, never trained on (docs/evaluation.md)"},
      {"data.eval_shards_dir", "held-out shard directory, never trained on"},
      {"data.eval_specforge_dir", "held-out SpecForge samples, never trained on"},
      {"data.target.path", "the target's Hugging Face directory (config.json, weights)"},
      {"data.target.random", "seeded random weights of config.json's shape (benchmarks)"},
      {"data.target.seed", "seed of the random target weights and random token ids"},
      {"data.target.prefetch",
       "compute the next window's batches ahead (CUDA: on their own stream, overlapping training)"},
      {"data.synthetic.seed", "seed of the synthetic target's weights and samples"},
      {"data.synthetic.num_layers", "decoder layers of the synthetic target"},
      {"data.synthetic.num_attention_heads", "synthetic target's query heads"},
      {"data.synthetic.num_key_value_heads", "synthetic target's key/value heads"},
      {"data.synthetic.head_dim", "synthetic target's head width"},
      {"data.synthetic.intermediate_size", "synthetic target's SwiGLU width"},
      {"data.synthetic.logit_scale", "multiplies the synthetic target's logits"},
      {"data.synthetic.temperature", "temperature the synthetic target samples at"},
      {"data.synthetic.prompt_length", "leading tokens of a sample without loss"},
      {"training.batch_size", "rows per micro-batch per rank"},
      {"training.accumulation_steps", "micro-batches per optimizer step"},
      {"training.total_steps", "optimizer steps of the run (the schedules' horizon)"},
      {"training.learning_rate", "AdamW learning rate (alias training.lr)"},
      {"training.lr_scheduler", "linear warmup then cosine to 0, or constant"},
      {"training.warmup_ratio", "share of total_steps spent warming up"},
      {"training.max_grad_norm", "global gradient-norm clip; 0 disables"},
      {"training.weight_decay", "AdamW weight decay"},
      {"training.adam_beta1", "AdamW beta1"},
      {"training.adam_beta2", "AdamW beta2"},
      {"training.adam_eps", "AdamW epsilon"},
      {"training.seed", "seed of initialisation, anchors and sampling"},
      {"training.dtype", "parameter and compute dtype (masters stay fp32)"},
      {"training.device", "auto: CUDA when present"},
      {"training.cpu_threads", "intra-op CPU threads; 0 = LibTorch's default"},
      {"training.deterministic",
       "CUDA: deterministic algorithms, so that resumed runs are bitwise (docs/model.md)"},
      {"training.eval_every", "steps between acceptance evaluations; 0 = off"},
      {"training.eval_decode_tokens",
       "each evaluation also decodes every held-out prompt for N tokens with the draft and the "
       "online target (tau in real decoding); 0 = off"},
      {"training.eval_decode_prompt_tokens",
       "prompt of that decoding: a held-out row's first N tokens; 0 = its tokens before the first "
       "supervised one"},
      {"training.eval_decode_temperature", "temperature of that decoding; 0 = greedy"},
      {"training.init_from",
       "checkpoint or export to take the draft's weights from (fresh optimizer and data)"},
      {"training.on_nonfinite", "a NaN/inf step: skip it, or save and stop"},
      {"objective.name", "the objective (and the map objective.<name> of its settings)"},
      {"checkpoint.dir", "where step-NNNNNN checkpoints go"},
      {"checkpoint.save_every", "steps between saves; 0 = only at the end"},
      {"checkpoint.keep_last", "complete checkpoints kept; 0 = all"},
      {"checkpoint.resume", "none, auto (newest valid checkpoint) or a checkpoint dir"},
      {"logging.every", "steps between metric records"},
      {"logging.metrics_file", "JSON-lines metrics; \"\" = none"},
      {"logging.progress", "progress line (auto: on a terminal)"},
      {"logging.level", "log level"},
      {"distributed.backend", "auto: NCCL for CUDA tensors, MPI for CPU"},
      {"distributed.sharding", "data parallel, or ZeRO-2/3 style sharding"},
      {"distributed.timeout_s", "a collective not done by then ends every rank"},
      {"distributed.prefetch", "zero3: gather the next unit while one runs"},
  };
  return descriptions;
}

std::string cell(const std::string& text) { return text.empty() ? "" : "`" + text + "`"; }

std::string row(const KeyFacts& key, const std::string& description) {
  return fmt::format("| `{}` | {} | {} | {} | {} |\n", key.key, key.type, cell(key.default_value),
                     key.allowed, description);
}

std::string section_of(const std::string& key) { return key.substr(0, key.find('.')); }

// Core's keys with the architectures' own (model.<architecture>.*) after the model section's.
std::vector<KeyFacts> model_and_core_keys(const std::vector<KeyFacts>& architecture_keys) {
  std::vector<KeyFacts> keys = core_key_facts();
  auto past_model = std::find_if(
      keys.begin(), keys.end(), [](const KeyFacts& key) { return section_of(key.key) != "model"; });
  keys.insert(past_model, architecture_keys.begin(), architecture_keys.end());
  return keys;
}

}  // namespace

std::string config_reference_markdown(const std::vector<std::string>& objective_names,
                                      const std::vector<KeyFacts>& objective_keys,
                                      const std::vector<KeyFacts>& architecture_keys) {
  std::string out =
      "# Configuration reference\n\n"
      "Generated by `dspine-train --config-reference` from the key table and the checks the\n"
      "parser runs (ctest `config_reference_current` fails when this page is stale). Every key\n"
      "is optional; an absent key keeps its default. `--set section.key=value` overrides one.\n"
      "Errors name the key, the value and what is allowed; unknown keys get a \"did you mean\".\n";
  const auto& descriptions = core_descriptions();
  const char* const header =
      "| key | type | default | allowed | description |\n|---|---|---|---|---|\n";
  std::string section;
  for (KeyFacts key : model_and_core_keys(architecture_keys)) {
    if (key.key == "objective.name") {
      key.allowed.clear();
      for (const auto& name : objective_names) {
        key.allowed += (key.allowed.empty() ? "" : ", ") + name;
      }
    }
    if (key.description.empty()) {  // core's keys; the kept maps' owners describe theirs
      auto description = descriptions.find(key.key);
      if (description == descriptions.end()) {
        fail("configuration reference: {} has no description (src/core/config_reference.cpp)",
             key.key);
      }
      key.description = description->second;
    }
    if (section_of(key.key) != section) {
      section = section_of(key.key);
      out += fmt::format("\n## {}\n\n{}", section, header);
    }
    out += row(key, key.description);
  }
  std::string objective;
  for (const KeyFacts& key : objective_keys) {
    if (key.description.empty()) fail("configuration reference: {} has no description", key.key);
    const std::string map = key.key.substr(0, key.key.rfind('.'));
    if (map != objective) {
      objective = map;
      out += fmt::format("\n## {}\n\n{}", objective, header);
    }
    out += row(key, key.description);
  }
  return out;
}

}  // namespace dspine::core
