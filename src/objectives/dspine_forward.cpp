#include "objectives/dspine_forward.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>

#include "core/error.h"
#include "model/dspine_config.h"
#include "model/norm_mlp.h"
#include "objectives/chunking.h"
#include "objectives/dspine_terms.h"
#include "objectives/window_replay.h"
#include "ops/vocab_objective_ops.h"

namespace dspine::objectives {

namespace {

void check_batch(const data::DraftBatch& b, const core::ModelConfig& c) {
  const char* missing = !b.input_ids.defined()                   ? "input_ids"
                        : !b.loss_mask.defined()                 ? "loss_mask"
                        : !b.hidden_states.defined()             ? "hidden_states"
                        : !b.target_last_hidden_states.defined() ? "target_last_hidden_states"
                                                                 : nullptr;
  if (missing) fail("dspine batch missing required feature {}", missing);
  const int64_t rows = b.input_ids.size(0), seq = b.input_ids.size(1);
  const int64_t width = c.hidden_size * static_cast<int64_t>(c.target_layer_ids.size());
  if (b.input_ids.dim() != 2 || b.loss_mask.sizes() != b.input_ids.sizes() ||
      b.hidden_states.dim() != 3 || b.hidden_states.size(0) != rows ||
      b.hidden_states.size(1) != seq || b.hidden_states.size(2) != width ||
      b.target_last_hidden_states.dim() != 3 || b.target_last_hidden_states.size(0) != rows ||
      b.target_last_hidden_states.size(1) != seq ||
      b.target_last_hidden_states.size(2) != c.hidden_size) {
    fail(
        "dspine batch shapes: input_ids {}, loss_mask {}, hidden_states {} (expected [B, S, {}]), "
        "target_last_hidden_states {} (expected [B, S, {}])",
        c10::str(b.input_ids.sizes()), c10::str(b.loss_mask.sizes()),
        c10::str(b.hidden_states.sizes()), width, c10::str(b.target_last_hidden_states.sizes()),
        c.hidden_size);
  }
}

// The blocks' anchors and keep on the host: sampled, or the overrides'.
AnchorSample anchors_for(const torch::Tensor& host_mask, int64_t num_anchors,
                         const RowStreams& streams, const BlockOverrides* overrides) {
  if (overrides == nullptr || !overrides->anchors.defined()) {
    return sample_anchors(host_mask, num_anchors, streams);
  }
  auto anchors = overrides->anchors.to(torch::kCPU, torch::kInt64);
  if (anchors.dim() != 2 || anchors.size(0) != host_mask.size(0)) {
    fail("DSpine explicit anchors must be [B, N] with B = {}, got {}", host_mask.size(0),
         c10::str(anchors.sizes()));
  }
  if (((anchors < 0) | (anchors > host_mask.size(1) - 2)).any().item<bool>()) {
    fail("DSpine explicit anchors must lie in [0, S-2] (S = {})", host_mask.size(1));
  }
  auto keep = overrides->keep.defined()
                  ? overrides->keep.to(torch::kCPU, torch::kBool)
                  : torch::ones(anchors.sizes(), anchors.options().dtype(torch::kBool));
  if (keep.sizes() != anchors.sizes()) {
    fail("DSpine explicit keep {} must match anchors {}", c10::str(keep.sizes()),
         c10::str(anchors.sizes()));
  }
  return {anchors, keep};
}

ops::VocabObjectiveOptions vocabulary_options(const DSpineSettings& settings, int64_t top_k) {
  ops::VocabObjectiveOptions o;
  o.ce_weight = settings.ce_weight;
  o.top_k = top_k;
  o.use_kernel = true;  // where the kernel takes the logits (CUDA fp32/bf16)
  return o;
}

// Supervised proposals whose draft argmax is the label (fp32 scalar).
at::Tensor correct(const at::Tensor& argmax, const DraftPass& pass) {
  return ((argmax == pass.labels.reshape({-1})) & pass.supervised.reshape({-1}).to(torch::kBool))
      .sum()
      .to(torch::kFloat32);
}

}  // namespace

at::Tensor teacher_hidden(const DraftPass& pass, const at::Tensor& blocks) {
  const auto positions =
      blocks.defined() ? pass.teacher_positions.index_select(0, blocks) : pass.teacher_positions;
  return pass.teacher_states.index_select(0, positions.reshape({-1}))
      .view({positions.size(0), positions.size(1), pass.teacher_states.size(1)});
}

DSpineTrainingModel::DSpineTrainingModel(const DSpineSettings& settings, model::DSpineDraft draft,
                                         at::Tensor embed_tokens, at::Tensor lm_head)
    : model_config_(draft->config()),
      settings_(settings),
      draft_(std::move(draft)),
      mask_token_id_(model::resolved_mask_token_id(model_config_)) {
  // objective.dspine's ranges were checked where the section was parsed (dspine_settings.cpp).
  const auto& weight = draft_->fc->weight;
  auto place = [&](const at::Tensor& t, const char* name) {
    const auto& c = model_config_;
    if (t.dim() != 2 || t.size(0) != c.vocab_size || t.size(1) != c.hidden_size) {
      fail("DSpine frozen {} must be [{}, {}], got {}", name, c.vocab_size, c.hidden_size,
           c10::str(t.sizes()));
    }
    return t.detach().to(weight.device(), weight.scalar_type()).set_requires_grad(false);
  };
  embed_tokens_ = place(embed_tokens, "embed_tokens");
  lm_head_ = place(lm_head, "lm_head");
  fused_vocabulary_ = model::use_fused_kernels(model_config_.fused_kernels, lm_head_.device());
}

DSpineOutput DSpineTrainingModel::forward(const data::DraftBatch& batch, const RowStreams& streams,
                                          const DSpineForwardOptions& options) {
  if (options.ce_only && torch::GradMode::is_enabled()) {
    fail("DSpine CE prepass requires gradients to be disabled");
  }
  return objective(draft_pass(batch, streams, options, !options.ce_only), options);
}

DraftPass DSpineTrainingModel::sample_blocks(const data::DraftBatch& batch,
                                             const RowStreams& streams,
                                             const DSpineForwardOptions& options) {
  check_batch(batch, model_config_);
  const auto device = lm_head_.device();
  const int64_t bs = model_config_.block_size;
  auto input_ids = batch.input_ids.to(device, torch::kInt64);
  auto loss_mask = batch.loss_mask.to(device);

  DraftPass out;
  out.schedule = dspine_schedule(settings_, options.step, options.total_steps);
  // Anchors and replacements are drawn on the host from its copy of the mask, then queued to the
  // device: the forward starts without waiting for the GPU (docs/model.md, "The host stays ahead").
  const auto sample =
      anchors_for(batch.loss_mask_on_host(), settings_.num_anchors, streams, options.overrides);
  at::Tensor replace;
  if (options.overrides != nullptr && options.overrides->replace.defined()) {
    replace = options.overrides->replace.to(torch::kCPU, torch::kBool) & sample.keep;
  } else if (options.training && out.schedule.replacement_probability > 0) {
    // As many draws per row as any batch of this sequence length can have blocks.
    const int64_t draws = std::min(settings_.num_anchors, input_ids.size(1) - 1);
    replace = draw_replacement(sample.keep, out.schedule.replacement_probability, streams,
                               std::max(draws, sample.keep.size(1)));
  }
  at::Tensor supervised_slots;
  if (options.overrides != nullptr && options.overrides->supervised_slots.defined()) {
    supervised_slots = options.overrides->supervised_slots.to(torch::kCPU, torch::kInt64);
    if (supervised_slots.sizes() != sample.anchors.sizes()) {
      fail("DSpine supervised_slots {} must match anchors {}", c10::str(supervised_slots.sizes()),
           c10::str(sample.anchors.sizes()));
    }
    supervised_slots = data::queue_copy_to(supervised_slots, device);
  }
  out.blocks = layout_blocks(input_ids, loss_mask, data::queue_copy_to(sample.anchors, device),
                             data::queue_copy_to(sample.keep, device), bs,
                             settings_.loss_decay_gamma, supervised_slots);
  if (replace.defined()) out.replace = data::queue_copy_to(replace, device);
  out.position_ids = block_position_ids(out.blocks.anchors, input_ids.size(1), bs);
  return out;
}

DraftPass DSpineTrainingModel::draft_pass(const data::DraftBatch& batch, const RowStreams& streams,
                                          const DSpineForwardOptions& options, bool full_rows) {
  DraftPass out = sample_blocks(batch, streams, options);
  const auto device = lm_head_.device();
  const auto dtype = lm_head_.scalar_type();
  const int64_t bs = model_config_.block_size, proposals = bs - 1;
  auto input_ids = batch.input_ids.to(device, torch::kInt64);
  auto hidden_states = batch.hidden_states.detach().to(device, dtype);
  const int64_t rows = input_ids.size(0);
  auto noise = torch::embedding(
      embed_tokens_,
      block_input_ids(input_ids, out.blocks.anchors, out.blocks.keep, bs, mask_token_id_));

  auto draft =
      draft_->forward(out.position_ids, out.blocks.anchors, out.blocks.keep, noise, hidden_states,
                      out.blocks.labels, out.replace, /*layer_features=*/full_rows);

  // §5.9: blocks become rows, M = B·N.
  const int64_t blocks = rows * out.blocks.anchors.size(1);
  const int64_t hidden = model_config_.hidden_size;
  out.hidden_rows = draft.hidden_states.slice(2, 1).reshape({blocks, proposals, hidden});
  out.labels = out.blocks.labels.slice(2, 1).reshape({blocks, proposals});
  out.weights = out.blocks.weights.reshape({blocks, proposals});
  out.supervised = out.blocks.supervised.reshape({blocks, proposals});
  out.predecessors = out.blocks.labels.slice(2, 0, proposals).reshape({blocks, proposals});
  if (full_rows) {
    out.pre_rows = draft.pre_injection.slice(2, 1).reshape({blocks, proposals, hidden});
    out.features = draft.layer_features.slice(3, 1)
                       .permute({1, 2, 0, 3, 4})
                       .reshape({blocks, model_config_.num_hidden_layers, proposals, -1});
    out.teacher_states =
        batch.target_last_hidden_states.detach().to(device, dtype).reshape({-1, hidden});
    out.teacher_positions =
        teacher_positions(out.blocks.source_index, input_ids.size(1)).reshape({blocks, proposals});
  }
  return out;
}

DSpineOutput DSpineTrainingModel::pass_output(const DraftPass& pass) {
  DSpineOutput out;
  out.schedule = pass.schedule;
  out.blocks = pass.blocks;
  out.replace = pass.replace;
  out.position_ids = pass.position_ids;
  out.denominator = pass.weights.sum();
  out.count = pass.supervised.sum().to(torch::kFloat32);
  return out;
}

std::pair<KeptPass, DSpineOutput> DSpineTrainingModel::keep_pass(
    const data::DraftBatch& batch, const RowStreams& streams, const DSpineForwardOptions& options) {
  if (!torch::GradMode::is_enabled()) fail("a kept DSpine prepass needs autograd on");
  KeptPass kept{draft_pass(batch, streams, options, /*full_rows=*/true), std::nullopt};
  if (fused_vocabulary_) kept.vocabulary = vocabulary_terms(kept.pass, nullptr);
  torch::NoGradGuard no_grad;
  auto ce_only = options;
  ce_only.ce_only = true;
  auto out = objective(kept.pass, ce_only, kept.vocabulary ? &*kept.vocabulary : nullptr);
  return {std::move(kept), std::move(out)};
}

DSpineOutput DSpineTrainingModel::objective(const DraftPass& pass,
                                            const DSpineForwardOptions& options,
                                            const ops::VocabObjectiveResult* vocabulary) {
  const auto device = lm_head_.device();
  DSpineOutput out = pass_output(pass);
  const int64_t chunk = settings_.objective_chunk_blocks;
  if (vocabulary != nullptr && (!fused_vocabulary_ || options.policy != nullptr)) {
    fail("DSpine vocabulary terms computed ahead need the fused vocabulary path and no policy");
  }

  if (options.ce_only) {
    RECORD_USER_SCOPE("dspine.vocab_ce");
    if (vocabulary != nullptr) {  // the CE of terms computed ahead
      out.ce = (pass.weights.reshape({-1}) * vocabulary->ce).sum();
      out.correct = correct(vocabulary->argmax, pass);
    } else if (fused_vocabulary_) {
      const auto hidden = pass.hidden_rows.reshape({-1, pass.hidden_rows.size(-1)});
      auto rows = ops::vocab_ce(hidden, pass.labels.reshape({-1}), lm_head_,
                                vocabulary_options(settings_, 0));
      out.ce = (pass.weights.reshape({-1}) * rows.ce).sum();
      out.correct = correct(rows.argmax, pass);
    } else {
      auto sums = checkpointed_chunk_reduce(
          [this](const std::vector<at::Tensor>& c) { return ce_terms(lm_head_, c); },
          {pass.hidden_rows, pass.labels, pass.weights, pass.supervised}, chunk, {});
      out.ce = sums[0].to(torch::kFloat32);
      out.correct = sums[1].to(torch::kFloat32);
    }
    out.numerator = out.ce;
    out.loss = out.numerator / out.denominator.clamp_min(1.0);
    return out;
  }
  if (!pass.teacher_states.defined()) {
    fail("DSpine objective terms need a draft pass with its full rows");
  }
  if (options.policy != nullptr && !fused_vocabulary_)
    fail("the GSPO policy term in the vocabulary row pass needs the fused vocabulary path");
  const auto sums =
      fused_vocabulary_ ? fused_terms(pass, options.policy, vocabulary) : reference_terms(pass);

  // §7.2: CE̅ of the window (replay) or of this batch over all ranks (immediate path).
  if (options.alignment_ce.defined()) {
    out.alignment_ce = options.alignment_ce.detach().to(device, torch::kFloat32);
  } else {
    if (options.comm == nullptr) fail("DSpine immediate forward needs a communicator");
    // fp64 [ΣCE, ΣD]: on the device when the caller checks them later and the communicator takes
    // device tensors (no synchronisation here), else a host buffer checked at once.
    const bool on_device = options.device_totals && options.comm->reduces_device_tensors();
    auto totals = torch::stack({sums.ce, out.denominator.detach()})
                      .to(on_device ? device : torch::Device(torch::kCPU), torch::kFloat64)
                      .contiguous();
    if (options.prepassed_totals.defined()) totals += options.prepassed_totals.to(totals.device());
    options.comm->all_reduce(totals);
    out.global_ce = totals[0];
    out.global_denominator = totals[1];
    if (!on_device) check_supervised(out.global_denominator.item<double>());
    out.alignment_ce = (out.global_ce / out.global_denominator).to(device, torch::kFloat32);
  }
  auto scale = out.schedule.alignment_beta * out.alignment_ce;
  out.numerator = sums.backbone + sums.refinement + scale * sums.alignment;
  out.loss = out.numerator / out.denominator.clamp_min(1.0);
  out.ce = sums.ce;
  out.l1 = sums.l1;
  out.refinement = sums.refinement.detach();
  out.alignment = sums.alignment.detach();
  out.correct = sums.correct;
  out.coverage = sums.coverage;
  out.policy = sums.policy;
  return out;
}

std::vector<at::Tensor> DSpineTrainingModel::trainable_parameters() const {
  std::vector<at::Tensor> trainable;
  for (const auto& p : draft_->parameters()) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  return trainable;
}

DSpineTrainingModel::TermSums DSpineTrainingModel::reference_terms(const DraftPass& pass) {
  auto& draft_impl = *draft_;
  const int64_t top_k = model_config_.dspine.top_k;
  std::vector<at::Tensor> inputs{pass.hidden_rows, pass.pre_rows,    pass.features,
                                 pass.labels,      pass.predecessors, teacher_hidden(pass),
                                 pass.weights,     pass.supervised};
  if (pinned_candidates_.defined()) {
    const auto blocks = pass.labels.sizes();
    if (pinned_candidates_.dim() != 3 || pinned_candidates_.size(0) != blocks[0] ||
        pinned_candidates_.size(1) != blocks[1] || pinned_candidates_.size(2) != top_k ||
        pinned_candidates_.scalar_type() != torch::kInt64) {
      fail("DSpine pinned candidates must be int64 [{}, {}, {}], got {} {}", blocks[0], blocks[1],
           top_k, c10::toString(pinned_candidates_.scalar_type()),
           c10::str(pinned_candidates_.sizes()));
    }
    inputs.push_back(pinned_candidates_.to(pass.labels.device()));
  }
  auto sums = checkpointed_chunk_reduce(
      [this, &draft_impl, top_k](const std::vector<at::Tensor>& c) {
        return objective_terms(draft_impl, lm_head_, settings_, top_k, c);
      },
      inputs, settings_.objective_chunk_blocks, trainable_parameters());
  const double cw = settings_.ce_weight;
  TermSums out;
  out.backbone = cw * sums[kCe] + (1.0 - cw) * sums[kL1];
  out.ce = sums[kCe].detach();
  out.l1 = sums[kL1].detach();
  out.refinement = sums[kRefine];
  out.alignment = sums[kAlign];
  out.correct = sums[kCorrect].detach().to(torch::kFloat32);
  out.coverage = sums[kCoverage].detach().to(torch::kFloat32);
  return out;
}

// The backbone terms in one fused call over all M·T rows (its own row chunks), then the
// refinement and alignment terms chunked as before, fed the candidates and teacher probabilities.
ops::VocabObjectiveResult DSpineTrainingModel::vocabulary_terms(const DraftPass& pass,
                                                                const ops::VocabPolicy* policy) {
  if (pinned_candidates_.defined()) fail("DSpine pinned candidates are for the reference terms");
  const int64_t hidden = pass.hidden_rows.size(-1);
  RECORD_USER_SCOPE("dspine.vocab_objective");
  // Teacher logits once per target position: the blocks overlap, so proposals share them.
  auto options = vocabulary_options(settings_, model_config_.dspine.top_k);
  options.policy = policy;
  return ops::vocab_objective(pass.hidden_rows.reshape({-1, hidden}), pass.teacher_states,
                              pass.labels.reshape({-1}), pass.weights.reshape({-1}), lm_head_,
                              options, pass.teacher_positions.reshape({-1}));
}

DSpineTrainingModel::TermSums DSpineTrainingModel::fused_terms(
    const DraftPass& pass, const ops::VocabPolicy* policy,
    const ops::VocabObjectiveResult* vocabulary) {
  const int64_t top_k = model_config_.dspine.top_k;
  const auto weights = pass.weights.reshape({-1});
  const auto rows = vocabulary != nullptr ? *vocabulary : vocabulary_terms(pass, policy);
  TermSums out;
  out.policy = rows.policy;
  out.backbone = rows.loss;
  out.ce = (weights * rows.ce).sum();
  out.l1 = (weights * rows.l1).sum();
  out.correct = correct(rows.argmax, pass);

  const auto blocks = pass.labels.sizes();
  last_candidates_ = rows.candidates.view({blocks[0], blocks[1], top_k});
  auto& draft_impl = *draft_;
  auto sums = checkpointed_chunk_reduce(
      [this, &draft_impl](const std::vector<at::Tensor>& c) {
        RECORD_USER_SCOPE("dspine.candidate_terms");
        return candidate_terms(draft_impl, lm_head_, settings_, c);
      },
      {pass.pre_rows, pass.features, pass.labels, pass.predecessors, pass.weights,
       pass.supervised, rows.candidates.view({blocks[0], blocks[1], top_k}),
       rows.teacher_candidates.view({blocks[0], blocks[1], top_k})},
      settings_.objective_chunk_blocks, trainable_parameters());
  out.refinement = sums[kCandRefine];
  out.alignment = sums[kCandAlign];
  out.coverage = sums[kCandCoverage].detach().to(torch::kFloat32);
  return out;
}

}  // namespace dspine::objectives
