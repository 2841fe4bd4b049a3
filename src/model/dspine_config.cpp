#include "model/dspine_config.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"

namespace dspine::model {

core::Settings settings_of(DSpineConfig& d, const core::Config& run) {
  // The bounds that involve the draft's sizes apply when model.architecture is dspine: the simple
  // architecture ignores these settings, and their defaults exceed its tiny models.
  const core::ModelConfig& m = run.model;
  const auto dspine = [&m] { return m.architecture == "dspine"; };
  const auto rank_rule = core::rule(
      "integer in [1, min(hidden_size, vocab_size - 1)]", [&d, &m, dspine](const std::string& key) {
        const int64_t max_rank = std::min(m.hidden_size, m.vocab_size - 1);
        std::optional<core::RuleFailure> failure;
        if (d.transfer_rank < 1 || (dspine() && d.transfer_rank > max_rank)) {
          failure = core::broken_rule(
              key, core::shown(d.transfer_rank),
              fmt::format("DSpine transfer_rank must be in [1, min(hidden_size, vocab_size - 1)] "
                          "= [1, {}]",
                          max_rank));
        }
        return failure;
      });
  const auto message_rule = core::rule("integer >= 1", [&d](const std::string& key) {
    std::optional<core::RuleFailure> failure;
    if (d.message_size < 1) {
      failure = core::broken_rule(key, core::shown(d.message_size),
                                  "DSpine requires message_size > 0 and top_k in [1, vocab_size]");
    }
    return failure;
  });
  const auto top_k_rule = core::rule("integer in [1, vocab_size]", [&d, &m, dspine](auto& key) {
    std::optional<core::RuleFailure> failure;
    if (d.top_k < 1 || (dspine() && d.top_k > m.vocab_size)) {
      failure = core::broken_rule(key, core::shown(d.top_k),
                                  fmt::format("DSpine requires message_size > 0 and top_k in [1, "
                                              "vocab_size] (vocab_size = {})",
                                              m.vocab_size));
    }
    return failure;
  });
  const auto layers_rule = core::rule("integer >= 0", [&d](const std::string& key) {
    std::optional<core::RuleFailure> failure;
    if (d.replacement_layers < 0) {
      failure = core::broken_rule(key, core::shown(d.replacement_layers),
                                  "DSpine warmup steps and replacement layers must be nonnegative");
    }
    return failure;
  });
  return {
      {"transfer_rank", &d.transfer_rank, rank_rule, "r, rank of the fixed transfer space"},
      {"message_size", &d.message_size, message_rule, "m, width of the adjacent-injection message"},
      {"top_k", &d.top_k, top_k_rule, "candidates of the refinement head"},
      {"replacement_layers", &d.replacement_layers, layers_rule,
       "layers whose predecessors replacement may swap"},
  };
}

void validate_dspine_model_config(const DSpineModelConfig& c) {
  const auto& d = c.dspine;
  if (c.hidden_size <= 0 || c.intermediate_size <= 0 || c.num_hidden_layers <= 0 ||
      c.vocab_size <= 1) {
    fail(
        "DSpine draft needs positive hidden_size, intermediate_size, num_hidden_layers and "
        "vocab_size > 1 (got H={}, I={}, L={}, V={})",
        c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size);
  }
  if (c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 ||
      c.num_attention_heads % c.num_key_value_heads != 0) {
    fail(
        "DSpine draft: num_attention_heads ({}) must be a positive multiple of "
        "num_key_value_heads ({})",
        c.num_attention_heads, c.num_key_value_heads);
  }
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) {
    fail("DSpine draft: head_dim must be positive and even for RoPE (got {})", c.head_dim);
  }
  if (c.target_layer_ids.empty()) fail("DSpine draft: model.target_layer_ids must not be empty");
  if (c.block_size < 2) {
    fail("DSpine block_size must include an anchor and at least one proposal (got {})",
         c.block_size);
  }
  const int64_t mask = resolved_mask_token_id(c);
  if (mask < 0 || mask >= c.vocab_size) {
    fail("DSpine mask_token_id {} is outside the vocabulary [0, {})", mask, c.vocab_size);
  }
  if (d.transfer_rank < 1 || d.transfer_rank > std::min(c.hidden_size, c.vocab_size - 1)) {
    fail(
        "DSpine transfer_rank must be in [1, min(hidden_size, vocab_size - 1)] (got {}, H={}, "
        "V={})",
        d.transfer_rank, c.hidden_size, c.vocab_size);
  }
  if (d.message_size <= 0 || d.top_k < 1 || d.top_k > c.vocab_size) {
    fail(
        "DSpine requires message_size > 0 and top_k in [1, vocab_size] (got message_size={}, "
        "top_k={}, V={})",
        d.message_size, d.top_k, c.vocab_size);
  }
  if (d.replacement_layers < 0) {
    fail("DSpine replacement layers must be nonnegative (got {})", d.replacement_layers);
  }
}

int64_t resolved_mask_token_id(const core::ModelConfig& config) {
  return config.mask_token_id < 0 ? config.vocab_size - 1 : config.mask_token_id;
}

nlohmann::json dspine_hf_config(const DSpineModelConfig& c, const HfConfigContext& context) {
  const auto& d = c.dspine;
  nlohmann::json dspine = context.training_settings;
  dspine.update({
      {"transfer_rank", d.transfer_rank},
      {"message_size", d.message_size},
      {"top_k", d.top_k},
      {"replacement_layers", d.replacement_layers},
  });
  nlohmann::json config = {
      {"architectures", {"DSpineDraftModel"}},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"auto_map", {{"AutoModel", "dspine.DSpineDraftModel"}}},
      {"block_size", c.block_size},
      // The target's; null (a loader reads it as "not set") where the run knows none.
      {"bos_token_id", context.bos_token_id},
      {"dflash_config",
       {{"block_size", c.block_size},
        {"mask_token_id", resolved_mask_token_id(c)},
        {"target_layer_ids", c.target_layer_ids}}},
      {"dspine_config", dspine},
      {"dtype", context.dtype == core::Dtype::kBf16 ? "bfloat16" : "float32"},
      {"eos_token_id", context.eos_token_id},
      {"head_dim", c.head_dim},
      {"hidden_act", "silu"},
      {"hidden_size", c.hidden_size},
      {"initializer_range", c.initializer_range},
      {"intermediate_size", c.intermediate_size},
      {"is_causal", true},
      {"layer_types", std::vector<std::string>(c.num_hidden_layers, "full_attention")},
      {"max_position_embeddings", context.max_position_embeddings},
      {"max_window_layers", c.num_hidden_layers},
      {"model_type", "qwen3"},
      {"num_attention_heads", c.num_attention_heads},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_key_value_heads", c.num_key_value_heads},
      {"num_target_layers", context.num_target_layers},
      {"rms_norm_eps", c.rms_norm_eps},
      // transformers 5 reads the RoPE base from rope_parameters, older readers from the
      // top-level rope_theta (transformers 5 accepts it beside an equal rope_parameters). No
      // rope_scaling: transformers 5's PretrainedConfig warns that it is deprecated, and older
      // readers default it to null.
      {"rope_parameters", {{"rope_theta", c.rope_theta}, {"rope_type", "default"}}},
      {"rope_theta", c.rope_theta},
      {"sliding_window", nullptr},
      {"tie_word_embeddings", false},
      {"use_cache", true},
      {"use_sliding_window", false},
      {"vocab_size", c.vocab_size},
  };
  if (context.max_position_embeddings <= 0) config.erase("max_position_embeddings");
  return config;
}

}  // namespace dspine::model
