// The tiny DSpine test configuration of the reference's worked example and the fixtures built on it
// (shared by the model, objective and multi-rank tests).
#pragma once

#include <vector>

#include <torch/torch.h>

#include "core/config.h"
#include "data/batch.h"
#include "model/draft_registry.h"
#include "model/dspine_config.h"
#include "objectives/dspine_objective.h"
#include "objectives/dspine_settings.h"

namespace dspine::testing {

// hidden 16, 4 heads / 2 kv heads of 4, 3 layers, vocab 32, block 4, mask 31, K = 3 (fc: 48 → 16),
// transfer rank 8, message 4, top-k 3; reference (unfused) kernels.
inline model::DSpineModelConfig tiny_model_config() {
  model::DSpineModelConfig c;
  c.architecture = "dspine";
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 4;
  c.num_hidden_layers = 3;
  c.vocab_size = 32;
  c.block_size = 4;
  c.mask_token_id = 31;
  c.target_layer_ids = {1, 4, 6};
  c.fused_kernels = dspine::core::FusedKernels::kOff;
  c.dspine.transfer_rank = 8;
  c.dspine.message_size = 4;
  c.dspine.top_k = 3;
  return c;
}

inline core::Config tiny_config(int64_t accumulation = 1) {
  core::Config c;
  const model::DSpineModelConfig draft = tiny_model_config();
  c.model = draft;
  c.set_section("model.dspine", draft.dspine);
  c.training.accumulation_steps = accumulation;
  c.objective.name = "dspine";
  return c;
}

// The draft configuration (model.* with model.dspine) of a run's configuration, resolved as the
// trainer's objective registry resolves it.
inline model::DSpineModelConfig draft_config(const core::Config& config) {
  return model::dspine_model_config(config.model, *model::resolve_draft(config, "dspine").settings);
}

// The training side of §12: num_anchors 4, γ = 7.
inline objectives::DSpineSettings tiny_settings(int64_t chunk_blocks = 0) {
  objectives::DSpineSettings s;
  s.num_anchors = 4;
  s.loss_decay_gamma = 7.0;
  s.objective_chunk_blocks = chunk_blocks;
  return s;
}

// Seed-17 draft with transfer space from head = randn(32, 16) and writes re-drawn N(0, 0.05).
inline std::unique_ptr<objectives::DSpineObjective> training_objective(
    const core::Config& config, const objectives::DSpineSettings& settings) {
  torch::manual_seed(17);
  auto head = torch::randn({32, 16});
  auto embed = torch::randn({32, 16});
  auto objective = objectives::make_dspine_objective(draft_config(config), settings,
                                                     config.training.accumulation_steps, embed,
                                                     head, torch::kCPU, torch::kFloat32);
  objective->on_fresh_start("");
  torch::NoGradGuard no_grad;
  for (auto& w : objective->draft()->injection->write_layers) w->weight.normal_(0.0, 0.05);
  return objective;
}

inline torch::Tensor mask_rows(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<torch::Tensor> out;
  for (const auto& r : rows) out.push_back(torch::tensor(r, torch::kInt64));
  return torch::stack(out);
}

// Random ids in [0, 30), hidden_states [rows, S, 48], target_last [rows, S, 16].
inline data::DraftBatch random_batch(const torch::Tensor& loss_mask, int64_t seed) {
  torch::manual_seed(seed);
  const int64_t rows = loss_mask.size(0), seq = loss_mask.size(1);
  data::DraftBatch b;
  b.input_ids = torch::randint(0, 30, {rows, seq}, torch::kInt64);
  b.loss_mask = loss_mask;
  b.hidden_states = torch::randn({rows, seq, 48});
  b.target_last_hidden_states = torch::randn({rows, seq, 16});
  return b;
}

}  // namespace dspine::testing
