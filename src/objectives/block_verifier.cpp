#include "objectives/block_verifier.h"

#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "objectives/dspine_terms.h"
#include "ops/logit_rows_ops.h"

namespace dspine::objectives {
namespace {

// Elements of one branch call's context scores (fp32): bounds the memory of a verification.
constexpr int64_t kBranchScoreElements = int64_t{1} << 27;
// Elements of one chunk of the target's logits (fp32).
constexpr int64_t kLogitElements = int64_t{1} << 26;

at::Tensor cat_or_empty(const std::vector<at::Tensor>& parts, const at::TensorOptions& options) {
  return parts.empty() ? torch::empty({0}, options) : torch::cat(parts);
}

// The target's greedy token (and the probability of the drafted token) at final-norm states
// [K, G, T, H], from its head in row chunks. On CUDA the argmax and log-sum-exp come from the
// row kernel (ops/logit_rows_ops.h) in one pass over the logits, without an fp32 copy.
BlockVerdict verdict_from_states(const target::Qwen3Model& target, const at::Tensor& states,
                                 const at::Tensor& tokens, bool with_probs) {
  const int64_t hidden = states.size(-1), vocab = target.dims().vocab_size;
  auto flat = states.reshape({-1, hidden});
  auto drafted = tokens.to(states.device(), torch::kInt64).reshape({-1, 1});
  const int64_t rows = flat.size(0);
  const int64_t chunk = std::max<int64_t>(1, kLogitElements / vocab);
  std::vector<at::Tensor> choices, probs;
  for (int64_t begin = 0; begin < rows; begin += chunk) {
    const int64_t n = std::min(chunk, rows - begin);
    auto logits = target.logits(flat.narrow(0, begin, n));
    auto [argmax, lse] = ops::logit_row_argmax_lse(logits, logits.is_cuda());
    choices.push_back(argmax);
    if (with_probs) {
      auto chosen = logits.gather(1, drafted.narrow(0, begin, n)).squeeze(1).to(torch::kFloat32);
      probs.push_back((chosen - lse).exp());
    }
  }
  BlockVerdict verdict;
  verdict.choices =
      cat_or_empty(choices, drafted.options()).view(tokens.sizes()).to(tokens.device());
  if (with_probs) {
    verdict.token_probs = cat_or_empty(probs, flat.options().dtype(torch::kFloat32))
                              .view(tokens.sizes())
                              .to(tokens.device());
  }
  return verdict;
}

// Row (sample) and anchor position of every kept block, on the CPU.
std::pair<at::Tensor, at::Tensor> kept_rows_and_anchors(const DraftPass& pass,
                                                        const at::Tensor& kept) {
  const int64_t per_row = pass.blocks.anchors.size(1);
  auto kept_cpu = kept.to(torch::kCPU, torch::kInt64);
  auto anchors = pass.blocks.anchors.reshape(-1).to(torch::kCPU, torch::kInt64)
                     .index_select(0, kept_cpu);
  return {kept_cpu.div(per_row, "floor"), anchors};
}

}  // namespace

BlockVerdict DataVerifier::verify(const data::DraftBatch& /*batch*/, const DraftPass& pass,
                                  const at::Tensor& kept, const at::Tensor& tokens,
                                  bool with_probs) const {
  BlockVerdict verdict;
  verdict.choices = pass.labels.index_select(0, kept).unsqueeze(1).expand(tokens.sizes());
  if (with_probs) verdict.token_probs = tokens.eq(verdict.choices).to(torch::kFloat32);
  return verdict;
}

BlockVerdict TeacherVerifier::verify(const data::DraftBatch& /*batch*/, const DraftPass& pass,
                                     const at::Tensor& kept, const at::Tensor& tokens,
                                     bool with_probs) const {
  torch::NoGradGuard no_grad;
  const int64_t blocks = tokens.size(0), group = tokens.size(1), slots = tokens.size(2);
  const int64_t vocab = lm_head_.size(0);
  // The blocks overlap, so their slots share target positions: each distinct position's logits
  // are projected once (at most B·S positions for the K·T slots: 6,144 for 15,360 at the recipe).
  const auto positions =
      pass.teacher_positions.index_select(0, kept.to(pass.teacher_positions.device()))
          .reshape({-1});  // [K·T]
  const auto unique = at::_unique2(positions, /*sorted=*/true, /*return_inverse=*/true,
                                   /*return_counts=*/false);
  const at::Tensor& distinct = std::get<0>(unique);       // [P] ascending positions
  const at::Tensor& slot_position = std::get<1>(unique);  // [K·T] each slot's index in distinct
  const int64_t rows = distinct.size(0);
  // objective_chunk_blocks' rows, and at most kLogitElements logits (a recipe vocabulary is large).
  const int64_t chunk =
      std::min(chunk_blocks_ > 0 ? chunk_blocks_ * slots : std::max<int64_t>(rows, 1),
               std::max<int64_t>(1, kLogitElements / vocab));
  // Each slot's G drafted tokens, [K·T, G], and their log-probabilities as chunks answer them.
  const auto drafted = tokens.to(positions.device(), torch::kInt64).permute({0, 2, 1}).reshape(
      {blocks * slots, group});
  at::Tensor log_probs;
  if (with_probs) log_probs = at::zeros(drafted.sizes(), drafted.options().dtype(torch::kFloat32));
  std::vector<at::Tensor> choices;
  for (int64_t begin = 0; begin < rows; begin += chunk) {
    const int64_t n = std::min(chunk, rows - begin);
    auto logits = project_logits(
        pass.teacher_states.index_select(0, distinct.narrow(0, begin, n)), lm_head_);  // [n, V]
    auto [argmax, lse] = ops::logit_row_argmax_lse(logits, logits.is_cuda());
    choices.push_back(argmax);
    if (with_probs) {
      // The slots whose position is in this chunk read their drafted tokens' logits from it.
      const auto local = slot_position - begin;
      const auto here = (local >= 0) & (local < n);
      const auto row = local.clamp(0, n - 1);
      const auto chosen = logits.contiguous().view({-1}).take(row.unsqueeze(1) * vocab + drafted);
      log_probs = at::where(here.unsqueeze(1),
                            chosen.to(torch::kFloat32) - lse.index_select(0, row).unsqueeze(1),
                            log_probs);
    }
  }
  BlockVerdict verdict;
  verdict.choices = cat_or_empty(choices, drafted.options())
                        .index_select(0, slot_position)
                        .view({blocks, 1, slots})
                        .expand(tokens.sizes())
                        .to(tokens.device());
  if (with_probs) {
    verdict.token_probs =
        log_probs.exp().view({blocks, slots, group}).permute({0, 2, 1}).to(tokens.device());
  }
  return verdict;
}

BlockVerdict TargetVerifier::verify(const data::DraftBatch& batch, const DraftPass& pass,
                                    const at::Tensor& kept, const at::Tensor& tokens,
                                    bool with_probs) const {
  torch::NoGradGuard no_grad;
  const int64_t blocks = tokens.size(0), group = tokens.size(1), slots = tokens.size(2);
  const auto [rows, anchors] = kept_rows_and_anchors(pass, kept);
  const auto device = target_.embed_tokens().device();
  auto ids = batch.input_ids.to(device, torch::kInt64);
  const int64_t samples = ids.size(0), length = ids.size(1);
  // The context: one cached pass over every sample.
  auto cache = target_.new_cache(samples, length);
  auto context = target_.step(ids, cache).last_hidden_state;  // [B, S, H]
  const int64_t hidden = context.size(2);
  auto states = torch::empty({blocks, group, slots, hidden}, context.options());
  // Slot 0 is the target's next token after the anchor itself.
  auto at_anchor = (rows * length + anchors).to(device);
  states.select(2, 0).copy_(
      context.reshape({-1, hidden}).index_select(0, at_anchor).unsqueeze(1).expand(
          {blocks, group, hidden}));
  // Slots 1..T-1 follow the block's own drafted tokens: branches of the sample's cache.
  const int64_t drafted_slots = slots - 1;
  if (drafted_slots > 0 && blocks > 0) {
    auto drafted = tokens.to(device, torch::kInt64).narrow(2, 0, drafted_slots);
    const int64_t per_call = std::max<int64_t>(
        1, kBranchScoreElements / (drafted_slots * target_.dims().num_attention_heads * length));
    auto later = states.narrow(2, 1, drafted_slots);
    for (int64_t sample = 0; sample < samples; ++sample) {
      auto members = rows.eq(sample).nonzero().squeeze(1);
      if (members.numel() == 0) continue;
      target::Qwen3Model::KvCache row_cache;
      for (size_t l = 0; l < cache.keys.size(); ++l) {
        row_cache.keys.push_back(cache.keys[l].narrow(0, sample, 1));
        row_cache.values.push_back(cache.values[l].narrow(0, sample, 1));
      }
      row_cache.length = cache.length;
      auto on_device = members.to(device);
      auto row_tokens = drafted.index_select(0, on_device).reshape({1, -1, drafted_slots});
      auto row_lengths = (anchors.index_select(0, members) + 1)
                             .repeat_interleave(group)
                             .view({1, -1})
                             .to(device);
      const int64_t branches = row_tokens.size(1);
      std::vector<at::Tensor> parts;
      for (int64_t begin = 0; begin < branches; begin += per_call) {
        const int64_t n = std::min(per_call, branches - begin);
        parts.push_back(target_.branch(row_tokens.narrow(1, begin, n),
                                       row_lengths.narrow(1, begin, n), row_cache));
      }
      later.index_copy_(0, on_device,
                        torch::cat(parts, 1).view({members.size(0), group, drafted_slots, hidden}));
    }
  }
  return verdict_from_states(target_, states, tokens, with_probs);
}

BlockVerdict PerBlockTargetVerifier::verify(const data::DraftBatch& batch, const DraftPass& pass,
                                            const at::Tensor& kept, const at::Tensor& tokens,
                                            bool with_probs) const {
  torch::NoGradGuard no_grad;
  const int64_t group = tokens.size(1), slots = tokens.size(2);
  const auto [kept_rows, kept_anchors] = kept_rows_and_anchors(pass, kept);
  // Every (block, candidate) on its own: K·G blocks.
  auto rows = kept_rows.repeat_interleave(group);
  auto anchors = kept_anchors.repeat_interleave(group);
  const int64_t blocks = rows.size(0);
  const auto device = target_.embed_tokens().device();
  auto ids = batch.input_ids.to(device, torch::kInt64);
  auto drafted = tokens.to(device, torch::kInt64).reshape({blocks, slots});
  std::vector<at::Tensor> parts;
  for (int64_t begin = 0; begin < blocks; begin += chunk_blocks_) {
    const int64_t n = std::min(chunk_blocks_, blocks - begin);
    const int64_t longest = anchors.narrow(0, begin, n).max().item<int64_t>() + 1 + slots;
    auto sequences = torch::zeros({n, longest}, ids.options());
    std::vector<int64_t> positions;  // flat index of the target's state for each slot
    for (int64_t i = 0; i < n; ++i) {
      const int64_t block = begin + i;
      const int64_t row = rows[block].item<int64_t>();
      const int64_t anchor = anchors[block].item<int64_t>();
      sequences[i].narrow(0, 0, anchor + 1).copy_(ids[row].narrow(0, 0, anchor + 1));
      sequences[i].narrow(0, anchor + 1, slots).copy_(drafted[block]);
      for (int64_t j = 0; j < slots; ++j) positions.push_back(i * longest + anchor + j);
    }
    auto hidden = target_.forward(sequences, {}).last_hidden_state;  // [n, longest, H]
    parts.push_back(hidden.reshape({n * longest, -1})
                        .index_select(0, torch::tensor(positions, ids.options())));
  }
  const int64_t width = target_.dims().hidden_size;
  auto states = parts.empty() ? torch::empty({0, width}, target_.embed_tokens().options())
                              : torch::cat(parts);
  return verdict_from_states(target_, states.view({tokens.size(0), group, slots, width}), tokens,
                             with_probs);
}

std::unique_ptr<BlockVerifier> make_verifier(const data::BatchSource& source) {
  if (const target::Qwen3Model* target = source.online_target()) {
    return std::make_unique<TargetVerifier>(*target);
  }
  return std::make_unique<DataVerifier>();
}

std::unique_ptr<BlockVerifier> make_reward_verifier(RewardSource source,
                                                    const target::Qwen3Model* online_target,
                                                    const at::Tensor& lm_head,
                                                    int64_t chunk_blocks) {
  if (source == RewardSource::kData) return std::make_unique<DataVerifier>();
  if (online_target != nullptr) return std::make_unique<TargetVerifier>(*online_target);
  return std::make_unique<TeacherVerifier>(lm_head, chunk_blocks);
}

}  // namespace dspine::objectives
