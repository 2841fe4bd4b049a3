// The tiny DSpine model of the reference's unit tests as configuration text (H = 16, V = 32, r = 8,
// m = 4, k = 3): the configuration and draft-registry tests read it (no torch needed).
#pragma once

namespace dspine::testing {

inline constexpr const char* kTinyDSpineYaml = R"(
model:
  architecture: dspine
  hidden_size: 16
  intermediate_size: 32
  num_hidden_layers: 3
  num_attention_heads: 4
  num_key_value_heads: 2
  head_dim: 4
  vocab_size: 32
  target_layer_ids: [1, 2, 3]
  dspine:
    transfer_rank: 8
    message_size: 4
    top_k: 3
objective:
  name: dspine
)";

}  // namespace dspine::testing
