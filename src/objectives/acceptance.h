// Acceptance length of a DSpine draft (the number that decides a draft's worth), from every anchor
// of held-out samples; τ counts the target's own token added at verification (accepted + 1).
// - Greedy: draft a block by backbone argmax, or by the refinement-head walk of inference, and
//   count the leading tokens the target accepts (who verifies: block_verifier.h).
// - Acceptance by position: the fraction of blocks whose first k proposals were all accepted.
// - Teacher-forced accuracy: backbone argmax against the data's token at every supervised slot.
// - Speculative sampling: drafting from the backbone distribution q at temperature 1 against the
//   target's distribution p (softmax of the target's head on its last hidden state), slot i is
//   accepted with probability α_i = Σ_y min(p_i(y), q_i(y)); the expected accepted count is
//   Σ_j Π_{i≤j} α_i (slots conditioned on the data's prefix, as in training).
// docs/evaluation.md describes the figures and where they are reported.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/batch.h"
#include "data/batch_source.h"
#include "target/qwen3_model.h"
#include "dist/communicator.h"
#include "model/dspine_draft.h"
#include "objectives/block_verifier.h"
#include "objectives/dspine_forward.h"
#include "objectives/dspine_settings.h"

namespace dspine::objectives {

struct AcceptanceStats {
  std::string continuation;         // the verifier's name
  int64_t blocks = 0;               // anchor blocks measured (all ranks)
  int64_t supervised_slots = 0;     // supervised proposals of those blocks
  double backbone_length = 0;       // mean τ, backbone argmax
  double refinement_length = 0;     // mean τ, refinement-head walk
  double sampled_length = 0;        // mean expected τ, speculative sampling from the backbone
  double accuracy = 0;              // teacher-forced backbone argmax accuracy
  std::vector<int64_t> backbone_histogram;    // blocks per accepted count 0..T
  std::vector<int64_t> refinement_histogram;
  std::vector<double> backbone_by_position;   // k = 1..T: blocks with the first k accepted
  std::vector<double> refinement_by_position;
};

// Blocks per accepted count 0..T ([T + 1] int64) of drafted blocks `tokens` [K, T] against the
// target's continuation `labels` [K, T]. Only supervised slots count: a block that runs past the
// end of its sequence or into unsupervised positions is accepted at most up to its last real slot.
at::Tensor accepted_histogram(const at::Tensor& tokens, const at::Tensor& labels,
                              const at::Tensor& supervised);

// Mean τ (accepted + 1) of a histogram of accepted counts; 0 for no blocks.
double mean_accepted_length(const std::vector<int64_t>& histogram);
// Fraction of blocks whose first k proposals were all accepted, k = 1..T; zeros for no blocks.
std::vector<double> acceptance_by_position(const std::vector<int64_t>& histogram);

// The figures as flat metric names (tau, tau_refine, tau_sampled, accuracy, accept_<k>,
// accept_refine_<k>, blocks): the trainer logs them under eval/, dspine-eval prints them.
std::map<std::string, double> acceptance_metrics(const AcceptanceStats& stats);
inline constexpr const char* kTauMetric = "tau";  // its key of the backbone's τ

// `samples` samples of `source` from global index `offset`, in batches of `rows`, on `device`.
std::vector<data::DraftBatch> held_out_batches(data::BatchSource& source, int64_t offset,
                                               int64_t samples, int64_t rows,
                                               const c10::Device& device);

// Measures a draft it shares with the trained objective (and the placed target tables), from
// every valid anchor of a row of `row_length` tokens (num_anchors = data.seq_len). Taking every
// valid anchor leaves nothing to chance: the anchors' row streams (row_streams.h, `seed` =
// training.seed, step 0, the rows of `batches` in order) only order the draws, so the trainer,
// dspine-eval and any split of the samples over ranks measure the same blocks, and no training
// draw depends on a measurement.
class AcceptanceEvaluator {
 public:
  AcceptanceEvaluator(DSpineSettings settings, int64_t row_length, uint64_t seed,
                      model::DSpineDraft draft, at::Tensor embed_tokens, at::Tensor lm_head);

  // Every valid anchor of `batches`, reduced over `comm` (collective: every rank calls it, with
  // the same number of batches).
  AcceptanceStats measure(const std::vector<data::DraftBatch>& batches, dist::Communicator& comm,
                          const BlockVerifier& verifier = DataVerifier());

 private:
  DSpineTrainingModel model_;
  int64_t top_k_, chunk_blocks_;
  uint64_t seed_;
};

}  // namespace dspine::objectives
