#include "bench/step_flops.h"

#include <algorithm>

namespace dspine::bench {

// Counting rules (B rows, S context tokens, N anchors, bs block size, T = bs - 1 proposals,
// Q = N·bs block tokens per row, P = B·N·T proposal rows; a product [m, k] × [k, n] is 2·m·k·n):
//   context       fc over the K target layers: B·S × K·H → H. The target's states are frozen
//                 inputs: the backward is the weight gradient only (1× forward).
//   projections   per layer q and o over the B·Q block tokens, k and v over the B·(S + Q)
//                 context and block tokens (GQA widths). Backward 2× (input and weight).
//   mlp           per layer gate, up and down over the B·Q block tokens. Backward 2×.
//   attention     per layer QKᵀ and PV on the visible query-key pairs only: a block's bs queries
//                 see the context prefix before its anchor (mean_anchor keys) and, causally,
//                 the block itself (bs·(bs+1)/2 pairs), 2·head_dim FLOPs per pair and product
//                 and query head. Backward 2× (dQ, dK, dV, dP; no recomputation counted).
//   injection     per layer the readout H → r over all B·Q slots; on the P written slots the
//                 message, receiver and predecessor gates r → m and the write m → H.
//                 Backward 2×.
//   refinement    the head's readout and write on the P rows (as one injection layer) plus the
//                 scores of top_k candidate rows of the frozen lm_head: P·top_k dot products of
//                 width H, whose backward is the input gradient only (1×).
//   teacher_logits  the target's softmax over the vocabulary, once per distinct target position
//                 the proposals read (B · teacher_positions rows × H → V), without gradient:
//                 overlapping blocks share positions, and the objective projects each once.
//   draft_logits    P × H → V; the lm_head is frozen: the backward is dX only (1×).
std::vector<FlopPart> dspine_step_flops(const model::DSpineModelConfig& model,
                                        const StepShape& shape) {
  const double b = static_cast<double>(shape.rows), s = static_cast<double>(shape.seq_len);
  const double n = static_cast<double>(shape.anchors), bs = static_cast<double>(model.block_size);
  const double h = static_cast<double>(model.hidden_size);
  const double k_layers = static_cast<double>(model.target_layer_ids.size());
  const double layers = static_cast<double>(model.num_hidden_layers);
  const double q_width = static_cast<double>(model.num_attention_heads * model.head_dim);
  const double kv_width = static_cast<double>(model.num_key_value_heads * model.head_dim);
  const double inter = static_cast<double>(model.intermediate_size);
  const double vocab = static_cast<double>(model.vocab_size);
  const double rank = static_cast<double>(model.dspine.transfer_rank);
  const double message = static_cast<double>(model.dspine.message_size);
  const double top_k = static_cast<double>(model.dspine.top_k);
  const double block_tokens = b * n * bs;
  const double proposals = b * n * (bs - 1);
  auto gemm = [](double m, double k, double cols) { return 2.0 * m * k * cols; };

  const double context = gemm(b * s, k_layers * h, h);
  const double projections =
      layers * (2 * gemm(block_tokens, h, q_width) + 2 * gemm(b * s + block_tokens, h, kv_width));
  const double mlp = layers * 3 * gemm(block_tokens, h, inter);
  const double pairs = b * n * (bs * shape.mean_anchor + bs * (bs + 1) / 2);
  const double attention = layers * 2 * 2.0 * pairs * q_width;
  const double write = 3 * gemm(proposals, rank, message) + gemm(proposals, message, h);
  const double injection = layers * (gemm(block_tokens, h, rank) + write);
  const double refine_head = gemm(proposals, h, rank) + write;
  const double scores = gemm(proposals * top_k, h, 1);
  const double logits = gemm(proposals, h, vocab);
  const double teacher = gemm(b * shape.teacher_positions, h, vocab);
  return {
      {"context", context, context},
      {"projections", projections, 2 * projections},
      {"mlp", mlp, 2 * mlp},
      {"attention", attention, 2 * attention},
      {"injection", injection, 2 * injection},
      {"refinement", refine_head + scores, 2 * refine_head + scores},
      {"teacher_logits", teacher, 0.0},
      {"draft_logits", logits, logits},
  };
}

double expected_teacher_positions(const std::vector<bool>& valid, int64_t anchors,
                                  int64_t proposals) {
  const int64_t positions = static_cast<int64_t>(valid.size());
  int64_t candidates = 0;
  for (bool v : valid) candidates += v;
  anchors = std::min(anchors, candidates);
  // Position p is read unless none of the m valid anchors in [p - proposals + 1, p] is drawn:
  // probability C(V - m, N) / C(V, N) = Π_{i<m} (V - N - i) / (V - i).
  double expected = 0.0;
  int64_t window = 0;  // valid anchors in [p - proposals + 1, p]
  for (int64_t p = 0; p < positions; ++p) {
    window += valid[p];
    if (p >= proposals) window -= valid[p - proposals];
    double none = 1.0;
    for (int64_t i = 0; i < window && none > 0.0; ++i) {
      none *= std::max<double>(0.0, double(candidates - anchors - i)) / double(candidates - i);
    }
    expected += 1.0 - none;
  }
  return expected;
}

double total_flops(const std::vector<FlopPart>& parts) {
  double total = 0.0;
  for (const auto& part : parts) total += part.forward + part.backward;
  return total;
}

}  // namespace dspine::bench
