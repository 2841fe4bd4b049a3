#include "objectives/dspine_terms.h"

#include <torch/torch.h>

namespace dspine::objectives {

at::Tensor project_logits(const at::Tensor& x, const at::Tensor& lm_head) {
  auto sizes = x.sizes().vec();
  sizes.back() = lm_head.size(0);
  return x.reshape({-1, x.size(-1)}).matmul(lm_head.t()).view(sizes);
}

namespace {

struct BackboneCe {
  torch::Tensor logits;     // z, fp32 [c, T, V]
  torch::Tensor log_probs;  // log_softmax(z)
  torch::Tensor ce;         // [c, T]
};

BackboneCe backbone_ce(const torch::Tensor& hidden, const torch::Tensor& labels,
                       const torch::Tensor& lm_head) {
  BackboneCe out;
  out.logits = project_logits(hidden, lm_head).to(torch::kFloat32);
  out.log_probs = torch::log_softmax(out.logits, -1);
  out.ce = -out.log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1);
  return out;
}

torch::Tensor correct_count(const torch::Tensor& logits, const torch::Tensor& labels,
                            const torch::Tensor& supervised) {
  torch::NoGradGuard no_grad;
  return ((logits.argmax(-1) == labels) & supervised).sum();
}

}  // namespace

std::vector<at::Tensor> objective_terms(model::DSpineDraftImpl& draft, const at::Tensor& lm_head,
                                        const DSpineSettings& settings, int64_t top_k,
                                        const std::vector<at::Tensor>& chunk) {
  const auto& hidden = chunk[kHidden];
  const auto& labels = chunk[kLabels];
  const auto& weights = chunk[kWeights];
  const auto& supervised = chunk[kSupervised].to(torch::kBool);
  const double cw = settings.ce_weight;

  torch::Tensor teacher;
  {
    torch::NoGradGuard no_grad;
    teacher =
        torch::softmax(project_logits(chunk[kTeacherHidden], lm_head).to(torch::kFloat32), -1);
  }
  auto backbone = backbone_ce(hidden, labels, lm_head);
  auto l1 = (backbone.log_probs.exp() - teacher).abs().sum(-1);

  auto candidates = std::get<1>(backbone.logits.detach().topk(top_k, -1, true, true));
  auto refined = draft.refine(chunk[kPre], chunk[kPredecessors]);  // [c, T, H]
  auto rows = torch::embedding(lm_head, candidates);               // [c, T, k, H]
  auto scores = rows.matmul(refined.unsqueeze(-1)).squeeze(-1).to(torch::kFloat32);
  auto refined_log_probs = torch::log_softmax(scores, -1);

  torch::Tensor target, gate, covered;
  {
    torch::NoGradGuard no_grad;
    auto candidate_mass = teacher.gather(-1, candidates);
    auto mass = candidate_mass.sum(-1);
    target = candidate_mass / mass.clamp_min(1e-30).unsqueeze(-1);
    gate = (mass > settings.candidate_mass_threshold).to(torch::kFloat32);
    covered = candidates == labels.unsqueeze(-1);
  }
  auto refine_ce = -(refined_log_probs * covered.to(torch::kFloat32)).sum(-1);
  auto refine_l1 = (refined_log_probs.exp() - target).abs().sum(-1) * gate;

  auto codes = torch::embedding(draft.transfer_codes, labels).to(torch::kFloat32);  // [c, T, r]
  auto alignment = 1.0 - torch::cosine_similarity(chunk[kFeatures].to(torch::kFloat32),
                                                  codes.unsqueeze(1), -1, 1e-8);  // [c, L, T]

  torch::Tensor coverage;
  {
    torch::NoGradGuard no_grad;
    coverage = (covered.any(-1) & supervised).sum();
  }
  return {
      (weights * backbone.ce).sum(),
      (weights * l1).sum(),
      (weights * (cw * refine_ce + (1.0 - cw) * refine_l1)).sum(),
      (weights.unsqueeze(1) * alignment).sum(),
      correct_count(backbone.logits, labels, supervised),
      coverage,
  };
}

std::vector<at::Tensor> ce_terms(const at::Tensor& lm_head, const std::vector<at::Tensor>& chunk) {
  const auto& labels = chunk[kCeLabels];
  auto backbone = backbone_ce(chunk[kCeHidden], labels, lm_head);
  return {(chunk[kCeWeights] * backbone.ce).sum(),
          correct_count(backbone.logits, labels, chunk[kCeSupervised].to(torch::kBool))};
}

}  // namespace dspine::objectives
