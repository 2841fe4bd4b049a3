#include "objectives/acceptance.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include "objectives/dspine_terms.h"
#include "objectives/gspo_rollout.h"

namespace dspine::objectives {
namespace {

// Σ over kept blocks of the expected accepted count under speculative sampling (see the header).
double expected_accepted(const DraftPass& pass, const at::Tensor& kept, const at::Tensor& lm_head,
                         int64_t chunk_blocks) {
  auto hidden = pass.hidden_rows.index_select(0, kept);
  auto teacher = teacher_hidden(pass, kept);
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

std::vector<int64_t> to_vector(const at::Tensor& counts) {
  auto cpu = counts.to(torch::kCPU, torch::kInt64).contiguous();
  return {cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + cpu.numel()};
}

DSpineSettings every_anchor(DSpineSettings settings, int64_t row_length) {
  settings.num_anchors = row_length;
  return settings;
}

}  // namespace

at::Tensor accepted_histogram(const at::Tensor& tokens, const at::Tensor& labels,
                              const at::Tensor& supervised) {
  const int64_t slots = tokens.size(1);
  auto accepted =
      accepted_prefix(tokens.unsqueeze(1), labels.unsqueeze(1), supervised.to(torch::kBool))
          .view(-1);
  return torch::bincount(accepted.cpu(), {}, slots + 1).to(torch::kInt64);
}

double mean_accepted_length(const std::vector<int64_t>& histogram) {
  double blocks = 0, accepted = 0;
  for (size_t a = 0; a < histogram.size(); ++a) {
    blocks += static_cast<double>(histogram[a]);
    accepted += static_cast<double>(histogram[a]) * static_cast<double>(a);
  }
  return blocks > 0 ? accepted / blocks + 1.0 : 0.0;
}

std::vector<double> acceptance_by_position(const std::vector<int64_t>& histogram) {
  double blocks = 0;
  for (int64_t count : histogram) blocks += static_cast<double>(count);
  std::vector<double> fractions(histogram.empty() ? 0 : histogram.size() - 1, 0.0);
  double at_least = 0;  // blocks with at least k accepted, k running down from T
  for (size_t k = fractions.size(); k >= 1; --k) {
    at_least += static_cast<double>(histogram[k]);
    fractions[k - 1] = blocks > 0 ? at_least / blocks : 0.0;
  }
  return fractions;
}

std::map<std::string, double> acceptance_metrics(const AcceptanceStats& stats) {
  std::map<std::string, double> metrics = {{"blocks", static_cast<double>(stats.blocks)},
                                           {kTauMetric, stats.backbone_length},
                                           {"tau_refine", stats.refinement_length},
                                           {"tau_sampled", stats.sampled_length},
                                           {"accuracy", stats.accuracy}};
  for (size_t k = 0; k < stats.backbone_by_position.size(); ++k) {
    metrics[fmt::format("accept_{}", k + 1)] = stats.backbone_by_position[k];
    metrics[fmt::format("accept_refine_{}", k + 1)] = stats.refinement_by_position[k];
  }
  return metrics;
}

std::vector<data::DraftBatch> held_out_batches(data::BatchSource& source, int64_t offset,
                                               int64_t samples, int64_t rows,
                                               const c10::Device& device) {
  std::vector<data::DraftBatch> batches;
  for (int64_t begin = 0; begin < samples; begin += rows) {
    source.seek(offset + begin);
    batches.push_back(source.next(std::min(rows, samples - begin)).to(device));
  }
  return batches;
}

AcceptanceEvaluator::AcceptanceEvaluator(DSpineSettings settings, int64_t row_length, uint64_t seed,
                                         model::DSpineDraft draft, at::Tensor embed_tokens,
                                         at::Tensor lm_head)
    : model_(every_anchor(settings, row_length), std::move(draft), std::move(embed_tokens),
             std::move(lm_head)),
      top_k_(model_.draft()->config().dspine.top_k),
      chunk_blocks_(settings.objective_chunk_blocks),
      seed_(seed) {}

AcceptanceStats AcceptanceEvaluator::measure(const std::vector<data::DraftBatch>& batches,
                                             dist::Communicator& comm,
                                             const BlockVerifier& verifier) {
  torch::NoGradGuard no_grad;
  int64_t first_row = 0;  // the rows of `batches` numbered in order, under training.seed, step 0
  GspoRolloutSettings settings;
  settings.top_k = top_k_;
  settings.chunk_blocks = chunk_blocks_;
  const int64_t slots = model_.draft()->config().block_size - 1;
  // Histograms of accepted counts 0..T of both walks, then [correct, supervised, Σ expected].
  auto counts = torch::zeros({2 * (slots + 1) + 3}, torch::kFloat64);
  auto histogram = [&](int64_t walk) { return counts.narrow(0, walk * (slots + 1), slots + 1); };
  auto totals = counts.narrow(0, 2 * (slots + 1), 3);
  for (const auto& batch : batches) {
    DSpineForwardOptions options;
    options.training = false;
    auto pass = model_.draft_pass(batch, RowStreams{seed_, 0, first_row}, options,
                                  /*full_rows=*/true);
    first_row += batch.input_ids.size(0);
    auto kept = pass.blocks.keep.reshape(-1).nonzero().squeeze(1);
    auto supervised = pass.supervised.index_select(0, kept);
    // Both walks' blocks [K, 2, T] in one verification.
    std::vector<at::Tensor> walks;
    for (auto sampling : {GspoSampling::kBackbone, GspoSampling::kRefinement}) {
      settings.sampling = sampling;
      walks.push_back(gspo_greedy_tokens(pass, kept, *model_.draft(), model_.lm_head(), settings));
    }
    auto tokens = torch::stack(walks, 1);
    auto verdict = verifier.verify(batch, pass, kept, tokens, /*with_probs=*/false);
    for (int64_t walk = 0; walk < 2; ++walk) {
      histogram(walk).add_(accepted_histogram(tokens.select(1, walk),
                                              verdict.choices.select(1, walk), supervised)
                               .to(torch::kFloat64));
    }
    // Teacher-forced: the backbone's tokens against the data's.
    auto labels = pass.labels.index_select(0, kept);
    totals[0].add_((walks[0].eq(labels) & supervised).sum().item<double>());
    totals[1].add_(supervised.sum().item<double>());
    totals[2].add_(expected_accepted(pass, kept, model_.lm_head(), chunk_blocks_));
  }
  comm.all_reduce(counts);
  AcceptanceStats stats;
  stats.continuation = verifier.name();
  stats.backbone_histogram = to_vector(histogram(0));
  stats.refinement_histogram = to_vector(histogram(1));
  for (int64_t count : stats.backbone_histogram) stats.blocks += count;
  stats.supervised_slots = static_cast<int64_t>(totals[1].item<double>());
  stats.backbone_length = mean_accepted_length(stats.backbone_histogram);
  stats.refinement_length = mean_accepted_length(stats.refinement_histogram);
  stats.backbone_by_position = acceptance_by_position(stats.backbone_histogram);
  stats.refinement_by_position = acceptance_by_position(stats.refinement_histogram);
  stats.sampled_length = stats.blocks > 0 ? totals[2].item<double>() / stats.blocks + 1.0 : 0.0;
  stats.accuracy = stats.supervised_slots > 0
                       ? totals[0].item<double>() / static_cast<double>(stats.supervised_slots)
                       : 0.0;
  return stats;
}

}  // namespace dspine::objectives
