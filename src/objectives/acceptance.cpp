#include "objectives/acceptance.h"

#include <torch/torch.h>

#include "objectives/dspine_terms.h"
#include "objectives/gspo_rollout.h"

namespace dspine::objectives {
namespace {

// Σ over kept blocks of the expected accepted count under speculative sampling (see the header).
double expected_accepted(const DraftPass& pass, const at::Tensor& kept, const at::Tensor& lm_head,
                         int64_t chunk_blocks) {
  auto hidden = pass.hidden_rows.index_select(0, kept);
  auto teacher = pass.teacher.index_select(0, kept);
  auto supervised = pass.supervised.index_select(0, kept).to(torch::kFloat32);
  const int64_t blocks = hidden.size(0);
  const int64_t chunk = chunk_blocks > 0 ? chunk_blocks : std::max<int64_t>(blocks, 1);
  double total = 0;
  for (int64_t begin = 0; begin < blocks; begin += chunk) {
    const int64_t n = std::min(chunk, blocks - begin);
    auto q = torch::softmax(project_logits(hidden.narrow(0, begin, n), lm_head).to(torch::kFloat32), -1);
    auto p = torch::softmax(project_logits(teacher.narrow(0, begin, n), lm_head).to(torch::kFloat32), -1);
    auto alpha = torch::minimum(p, q).sum(-1) * supervised.narrow(0, begin, n);  // [n, T]
    total += alpha.cumprod(1).sum().item<double>();
  }
  return total;
}

}  // namespace

AcceptanceStats measure_acceptance(DSpineTrainingModel& model,
                                   const std::vector<data::DraftBatch>& batches, int64_t top_k,
                                   int64_t chunk_blocks, at::Generator& generator,
                                   dist::Communicator& comm) {
  torch::NoGradGuard no_grad;
  GspoRolloutSettings settings;
  settings.top_k = top_k;
  settings.chunk_blocks = chunk_blocks;
  const int64_t slots = model.draft()->config().block_size - 1;
  // Histograms of accepted counts 0..T for both walks, summed over batches and ranks.
  auto counts = torch::zeros({2, slots + 1}, torch::kFloat64);
  double sampled = 0;
  for (const auto& batch : batches) {
    DSpineForwardOptions options;
    options.training = false;
    auto pass = model.draft_pass(batch, generator, options, /*full_rows=*/true);
    auto kept = pass.blocks.keep.reshape(-1).nonzero().squeeze(1);
    auto labels = pass.labels.index_select(0, kept);
    auto supervised = pass.supervised.index_select(0, kept);
    int row = 0;
    for (auto sampling : {GspoSampling::kBackbone, GspoSampling::kRefinement}) {
      settings.sampling = sampling;
      auto tokens = gspo_greedy_tokens(pass, kept, *model.draft(), model.lm_head(), settings);
      auto accepted = accepted_prefix(tokens.unsqueeze(1), labels, supervised).view(-1);
      counts[row++] += torch::bincount(accepted.cpu(), {}, slots + 1).to(torch::kFloat64);
    }
    sampled += expected_accepted(pass, kept, model.lm_head(), chunk_blocks);
  }
  auto sampled_total = torch::tensor({sampled}, torch::kFloat64);
  counts = counts.contiguous();
  comm.all_reduce(counts);
  comm.all_reduce(sampled_total);
  AcceptanceStats stats;
  auto values = torch::arange(slots + 1, torch::kFloat64);
  const double blocks = counts[0].sum().item<double>();
  stats.blocks = static_cast<int64_t>(blocks);
  auto mean_length = [&](int row) {
    return blocks > 0 ? (counts[row] * values).sum().item<double>() / blocks + 1.0 : 0.0;
  };
  stats.backbone_length = mean_length(0);
  stats.refinement_length = mean_length(1);
  stats.sampled_length = blocks > 0 ? sampled_total.item<double>() / blocks + 1.0 : 0.0;
  for (int64_t i = 0; i <= slots; ++i) {
    stats.backbone_histogram.push_back(static_cast<int64_t>(counts[0][i].item<double>()));
    stats.refinement_histogram.push_back(static_cast<int64_t>(counts[1][i].item<double>()));
  }
  return stats;
}

}  // namespace dspine::objectives
