#include "model/state_layout.h"

#include <fmt/format.h>

namespace dspine::model {

std::vector<StateEntry> dspine_state_layout(const DSpineModelConfig& c) {
  const int64_t hidden = c.hidden_size, q_width = c.num_attention_heads * c.head_dim;
  const int64_t kv_width = c.num_key_value_heads * c.head_dim;
  const int64_t rank = c.dspine.transfer_rank, message = c.dspine.message_size;
  const int64_t context = hidden * static_cast<int64_t>(c.target_layer_ids.size());
  std::vector<StateEntry> layout;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string layer = fmt::format("layers.{}.", i);
    layout.insert(layout.end(), {
        {layer + "self_attn.q_proj.weight", {q_width, hidden}},
        {layer + "self_attn.k_proj.weight", {kv_width, hidden}},
        {layer + "self_attn.v_proj.weight", {kv_width, hidden}},
        {layer + "self_attn.o_proj.weight", {hidden, q_width}},
        {layer + "self_attn.q_norm.weight", {c.head_dim}},
        {layer + "self_attn.k_norm.weight", {c.head_dim}},
        {layer + "mlp.gate_proj.weight", {c.intermediate_size, hidden}},
        {layer + "mlp.up_proj.weight", {c.intermediate_size, hidden}},
        {layer + "mlp.down_proj.weight", {hidden, c.intermediate_size}},
        {layer + "input_layernorm.weight", {hidden}},
        {layer + "post_attention_layernorm.weight", {hidden}},
    });
  }
  layout.insert(layout.end(), {{"norm.weight", {hidden}},
                               {"fc.weight", {hidden, context}},
                               {"hidden_norm.weight", {hidden}},
                               {"injection.bias", {message}}});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layout.push_back({fmt::format("injection.readouts.{}.weight", i), {rank, hidden}});
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layout.push_back({fmt::format("injection.writes.{}.weight", i), {hidden, message}});
  }
  layout.insert(layout.end(), {{"injection.message.weight", {message, rank}},
                               {"injection.receiver_gate.weight", {message, rank}},
                               {"injection.predecessor_gate.weight", {message, rank}},
                               {"transfer_codes", {c.vocab_size, rank}},
                               {"transfer_ready", {}}});
  return layout;
}

}  // namespace dspine::model
