#include "objectives/ce_objective.h"

#include <torch/torch.h>

#include "core/error.h"

namespace dspine::objectives {
namespace {

// Position t predicts token t+1 where loss_mask[t+1] is set.
torch::Tensor label_mask(const data::DraftBatch& batch) {
  return batch.loss_mask.slice(1, 1).to(torch::kBool);
}

}  // namespace

CeObjective::CeObjective(model::SimpleDraft model, torch::Tensor lm_head)
    : model_(std::move(model)), lm_head_(std::move(lm_head)) {}

// Nothing derives from the target: a fresh draft keeps its random initialisation.
std::string CeObjective::on_fresh_start(const std::string& init_from) { return init_from; }

CeObjective::Terms CeObjective::compute(const data::DraftBatch& batch) {
  const auto mask = label_mask(batch).reshape({-1});
  const auto labels = batch.input_ids.slice(1, 1).reshape({-1}).index({mask});
  const int64_t width = batch.hidden_states.size(-1);
  const auto device = lm_head_.device();
  const auto dtype = lm_head_.scalar_type();

  // Flattened projection: only supervised rows reach the vocabulary GEMM.
  auto hidden = batch.hidden_states.slice(1, 0, -1).reshape({-1, width}).index({mask});
  auto features = model_->forward(hidden.to(device, dtype));
  auto logits = torch::matmul(features, lm_head_.t()).to(torch::kFloat);
  auto log_probs = torch::log_softmax(logits, -1);
  auto target = labels.to(device);
  auto ce = -log_probs.gather(1, target.unsqueeze(1)).squeeze(1);

  Terms terms;
  terms.ce_sum = ce.sum();
  terms.tokens = labels.numel();
  torch::NoGradGuard no_grad;
  auto teacher_hidden = batch.target_last_hidden_states.slice(1, 0, -1)
                            .reshape({-1, lm_head_.size(1)})
                            .index({mask})
                            .to(device, dtype);
  auto teacher_logits = torch::matmul(teacher_hidden, lm_head_.t()).to(torch::kFloat);
  auto draft_top1 = logits.argmax(-1);
  auto l1 = (log_probs.exp() - torch::softmax(teacher_logits, -1)).abs().sum();
  terms.stats = torch::stack({terms.ce_sum.detach(), (draft_top1 == target).sum().to(torch::kFloat),
                              (draft_top1 == teacher_logits.argmax(-1)).sum().to(torch::kFloat),
                              l1})
                    .to(torch::kCPU, torch::kDouble);
  return terms;
}

void CeObjective::begin_window(const std::vector<data::DraftBatch>& micro_batches,
                               StepContext& context) {
  double tokens = 0;
  for (const auto& batch : micro_batches) tokens += label_mask(batch).sum().item<double>();
  auto global = torch::tensor({tokens}, torch::kDouble);
  context.comm->all_reduce(global);
  window_tokens_ = global.item<double>();
  if (window_tokens_ <= 0) fail("ce objective: the window has no supervised tokens on any rank");
  window_stats_ = torch::zeros({4}, torch::kDouble);
  window_micro_steps_ = 0;
  window_size_ = static_cast<int64_t>(micro_batches.size());
}

MicroStepResult CeObjective::micro_step(const data::DraftBatch& batch, int64_t index,
                                        StepContext& context) {
  if (index != window_micro_steps_ || index >= window_size_) {
    fail("ce objective: micro-step {} out of order (expected {} of a {}-batch window)", index,
         window_micro_steps_, window_size_);
  }
  ++window_micro_steps_;
  auto terms = compute(batch);
  window_stats_ += terms.stats;
  return {terms.ce_sum / window_tokens_};
}

std::map<std::string, double> CeObjective::reduce_stats(torch::Tensor stats, double tokens,
                                                        StepContext& context) const {
  context.comm->all_reduce(stats);
  const double n = std::max(tokens, 1.0);
  return {{"ce", stats[0].item<double>() / n},
          {"accuracy", stats[1].item<double>() / n},
          {"teacher_agreement", stats[2].item<double>() / n},
          {"l1", stats[3].item<double>() / n}};
}

std::map<std::string, double> CeObjective::end_window(StepContext& context) {
  if (window_micro_steps_ != window_size_) {
    fail("ce objective: window ended after {} of {} micro-batches", window_micro_steps_,
         window_size_);
  }
  return reduce_stats(window_stats_, window_tokens_, context);
}

std::map<std::string, double> CeObjective::evaluate(const data::DraftBatch& batch,
                                                    StepContext& context) {
  torch::NoGradGuard no_grad;
  auto terms = compute(batch);
  auto tokens = torch::tensor({static_cast<double>(terms.tokens)}, torch::kDouble);
  context.comm->all_reduce(tokens);
  return reduce_stats(terms.stats, tokens.item<double>(), context);
}

}  // namespace dspine::objectives
