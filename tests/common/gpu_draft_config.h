// The DSpine draft shape of the GPU decoding tests: two layers of 4 query and 2 key/value heads of
// 64, hidden 256, a block of 8, vocabulary 300 (mask 299), reading target layers 1 and 3; shapes
// the fused and block kernels take.
#pragma once

#include "model/dspine_config.h"

namespace dspine::testing {

inline model::DSpineModelConfig gpu_draft_config() {
  model::DSpineModelConfig c;
  c.architecture = "dspine";
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.num_hidden_layers = 2;
  c.vocab_size = 300;
  c.block_size = 8;
  c.mask_token_id = 299;
  c.target_layer_ids = {1, 3};
  c.dspine.transfer_rank = 16;
  c.dspine.message_size = 8;
  c.dspine.top_k = 4;
  return c;
}

}  // namespace dspine::testing
