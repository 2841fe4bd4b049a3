#include "objectives/dspine_terms.h"

#include <torch/torch.h>

#include "ops/candidate_scores_ops.h"
#include "ops/cosine_alignment_ops.h"

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

// The chunk tensors the refinement and alignment terms read, whatever the chunk layout.
struct CandidateInputs {
  const at::Tensor& pre;
  const at::Tensor& features;
  const at::Tensor& labels;
  const at::Tensor& predecessors;
  const at::Tensor& weights;
  const at::Tensor& supervised;
  const at::Tensor& candidates;      // [c, T, k] int64
  const at::Tensor& candidate_mass;  // [c, T, k] fp32 teacher probabilities, no grad
};

// {R, A, coverage} of §7.1 step 10 from the candidates and the teacher's probabilities there.
std::vector<at::Tensor> refinement_and_alignment(model::DSpineDraftImpl& draft,
                                                 const at::Tensor& lm_head,
                                                 const DSpineSettings& settings,
                                                 const CandidateInputs& in) {
  const auto& labels = in.labels;
  const auto& weights = in.weights;
  const auto& candidates = in.candidates;
  const auto& candidate_mass = in.candidate_mass;
  const double cw = settings.ce_weight;
  auto refined = draft.refine(in.pre, in.predecessors);  // [c, T, H]
  // [c, T, k] fp32; the kernels read the candidates' LM-head rows in place, where the reference
  // gathers them into a [c, T, k, H] tensor.
  const bool fused_scores =
      draft.norm->fused && ops::candidate_scores_fusable(lm_head, candidates, refined);
  auto scores = fused_scores ? ops::candidate_scores_fused(lm_head, candidates, refined)
                             : ops::candidate_scores_reference(lm_head, candidates, refined);
  auto refined_log_probs = torch::log_softmax(scores, -1);

  torch::Tensor target, gate, covered;
  {
    torch::NoGradGuard no_grad;
    auto mass = candidate_mass.sum(-1);
    target = candidate_mass / mass.clamp_min(1e-30).unsqueeze(-1);
    gate = (mass > settings.candidate_mass_threshold).to(torch::kFloat32);
    covered = candidates == labels.unsqueeze(-1);
  }
  auto refine_ce = -(refined_log_probs * covered.to(torch::kFloat32)).sum(-1);
  auto refine_l1 = (refined_log_probs.exp() - target).abs().sum(-1) * gate;

  auto codes = torch::embedding(draft.transfer_codes, labels).to(torch::kFloat32);  // [c, T, r]
  // The draft's kernel choice (its norms are fused exactly when it is) picks the cosine's too.
  constexpr double kCosineEps = 1e-8;
  const bool fused = draft.norm->fused && ops::cosine_alignment_fusable(in.features, codes);
  auto alignment = 1.0 - (fused ? ops::cosine_alignment_fused(in.features, codes, kCosineEps)
                                : ops::cosine_alignment_reference(in.features, codes,
                                                                  kCosineEps));  // [c, L, T]

  torch::Tensor coverage;
  {
    torch::NoGradGuard no_grad;
    coverage = (covered.any(-1) & in.supervised.to(torch::kBool)).sum();
  }
  return {
      (weights * (cw * refine_ce + (1.0 - cw) * refine_l1)).sum(),
      (weights.unsqueeze(1) * alignment).sum(),
      coverage,
  };
}

}  // namespace

BackboneTerms backbone_terms(const at::Tensor& hidden, const at::Tensor& teacher_hidden,
                             const at::Tensor& labels, const at::Tensor& weights,
                             const at::Tensor& supervised, const at::Tensor& lm_head,
                             int64_t top_k, const at::Tensor& candidates) {
  torch::Tensor teacher;
  {
    torch::NoGradGuard no_grad;
    teacher = torch::softmax(project_logits(teacher_hidden, lm_head).to(torch::kFloat32), -1);
  }
  auto backbone = backbone_ce(hidden, labels, lm_head);
  auto l1 = (backbone.log_probs.exp() - teacher).abs().sum(-1);

  BackboneTerms out;
  out.candidates = candidates.defined()
                       ? candidates
                       : std::get<1>(backbone.logits.detach().topk(top_k, -1, true, true));
  {
    torch::NoGradGuard no_grad;
    out.candidate_mass = teacher.gather(-1, out.candidates);
  }
  out.ce = (weights * backbone.ce).sum();
  out.l1 = (weights * l1).sum();
  out.correct = correct_count(backbone.logits, labels, supervised.to(torch::kBool));
  return out;
}

std::vector<at::Tensor> objective_terms(model::DSpineDraftImpl& draft, const at::Tensor& lm_head,
                                        const DSpineSettings& settings, int64_t top_k,
                                        const std::vector<at::Tensor>& chunk) {
  const auto& labels = chunk[kLabels];
  const auto& weights = chunk[kWeights];
  auto backbone = backbone_terms(chunk[kHidden], chunk[kTeacherHidden], labels, weights,
                                 chunk[kSupervised], lm_head, top_k,
                                 chunk.size() > kPinnedCandidates ? chunk[kPinnedCandidates]
                                                                  : at::Tensor());
  auto rest = refinement_and_alignment(
      draft, lm_head, settings,
      {chunk[kPre], chunk[kFeatures], labels, chunk[kPredecessors], weights, chunk[kSupervised],
       backbone.candidates, backbone.candidate_mass});
  return {backbone.ce,       backbone.l1,      rest[kCandRefine],
          rest[kCandAlign],  backbone.correct, rest[kCandCoverage]};
}

std::vector<at::Tensor> candidate_terms(model::DSpineDraftImpl& draft, const at::Tensor& lm_head,
                                        const DSpineSettings& settings,
                                        const std::vector<at::Tensor>& chunk) {
  return refinement_and_alignment(
      draft, lm_head, settings,
      {chunk[kCandPre], chunk[kCandFeatures], chunk[kCandLabels], chunk[kCandPredecessors],
       chunk[kCandWeights], chunk[kCandSupervised], chunk[kCandidates], chunk[kCandidateMass]});
}

std::vector<at::Tensor> ce_terms(const at::Tensor& lm_head, const std::vector<at::Tensor>& chunk) {
  const auto& labels = chunk[kCeLabels];
  auto backbone = backbone_ce(chunk[kCeHidden], labels, lm_head);
  return {(chunk[kCeWeights] * backbone.ce).sum(),
          correct_count(backbone.logits, labels, chunk[kCeSupervised].to(torch::kBool))};
}

}  // namespace dspine::objectives
