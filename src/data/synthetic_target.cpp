#include "data/synthetic_target.h"

#include <cmath>
#include <limits>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/ParallelGuard.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "core/error.h"
#include "data/seeding.h"

// MKL, LibTorch's CPU BLAS on x86, runs every gemm on all intra-op threads, even inside
// at::parallel_for (ATen switches MKL's dynamic adjustment off). For the thousands of tiny gemms
// of a sample that costs far more than it saves (and, on a loaded machine, spins for seconds), so
// sampling asks MKL for one thread on the calling thread only. Weak: absent in builds without MKL.
// (MKL_Set_Num_Threads_Local is the C entry point behind mkl.h's mkl_set_num_threads_local.)
extern "C" int MKL_Set_Num_Threads_Local(int threads) __attribute__((weak));

namespace dspine::data {
namespace {

// Single-threaded ATen kernels and BLAS on this thread for the guard's lifetime; nothing global
// changes. Serial reductions also keep samples independent of the machine's thread count.
class SerialCompute {
 public:
  SerialCompute()
      : parallel_(true),
        previous_blas_(MKL_Set_Num_Threads_Local ? MKL_Set_Num_Threads_Local(1) : 0) {}
  ~SerialCompute() {
    if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(previous_blas_);
  }
  SerialCompute(const SerialCompute&) = delete;
  SerialCompute& operator=(const SerialCompute&) = delete;

 private:
  c10::ParallelGuard parallel_;  // at::parallel_for runs inline while it is set
  int previous_blas_;
};

// Attention logits get this extra gain (via q_norm's weight): with unit-RMS queries and keys the
// scores would have std ~1 and attention would be nearly uniform; sharper attention makes the
// next token depend on specific earlier tokens, not just on a blurred average of the prefix.
constexpr double kQueryNormGain = 2.0;
// lm_head rows are drawn so that the logits of a unit-RMS final state have std
// kHeadGain * sqrt(2 ln V). The max of V Gaussians sits ~sqrt(2 ln V) std above the mean, so this
// keeps the peakedness roughly independent of the vocabulary size; 1.5 gives a mean top-1
// probability of ~0.6 (entropy ~1.3 nats, varying by context) at the default sizes.
constexpr double kHeadGain = 1.5;

at::Generator seeded_generator(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(generator_seed(seed));
}

at::Tensor normal(at::Generator& gen, at::IntArrayRef shape, double std) {
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)).mul_(std);
}

// Written out rather than at::rms_norm: on CPU that op's dtype round trips cost more than the
// math at these sizes, and sampling calls it thousands of times.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return x * at::rsqrt(x.square().mean(-1, /*keepdim=*/true).add_(eps)) * weight;
}

// RoPE (rotate-half convention, as in Qwen3) on x [B, S, heads, d] for positions 0..S-1.
at::Tensor apply_rope(const at::Tensor& x, double theta) {
  const int64_t seq = x.size(1), dim = x.size(3), half = dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = std::pow(theta, -2.0 * double(i) / double(dim));
  std::vector<float> angles(static_cast<size_t>(seq * dim));
  for (int64_t s = 0; s < seq; ++s) {
    for (int64_t i = 0; i < half; ++i) {
      angles[s * dim + i] = angles[s * dim + half + i] = static_cast<float>(double(s) * inv_freq[i]);
    }
  }
  const auto table = at::tensor(angles).view({seq, 1, dim});
  const auto halves = x.chunk(2, -1);
  return x * table.cos() + at::cat({halves[1].neg(), halves[0]}, -1) * table.sin();
}

// Causal grouped-query attention: q [B, S, heads, d], k and v [B, S, kv_heads, d] ->
// [B, S, heads * d]. Query head h reads key/value head h / (heads / kv_heads). Written out
// because at these sizes the fused CPU kernel's setup dominates its run time.
at::Tensor causal_gqa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t batch = q.size(0), seq = q.size(1), heads = q.size(2), dim = q.size(3);
  const int64_t kv_heads = k.size(2), group = heads / kv_heads;
  // The `group` query heads sharing a key/value head are stacked along the query axis.
  const auto queries = q.permute({0, 2, 1, 3}).reshape({batch, kv_heads, group * seq, dim});
  auto scores = at::matmul(queries, k.permute({0, 2, 3, 1})).mul_(1.0 / std::sqrt(double(dim)));
  const auto future = at::ones({seq, seq}, at::TensorOptions().dtype(at::kBool)).triu_(1);
  scores.view({batch, kv_heads, group, seq, seq})
      .masked_fill_(future, -std::numeric_limits<float>::infinity());
  const auto out = at::matmul(at::softmax(scores, -1), v.transpose(1, 2));  // [B, kv, g*S, d]
  return out.view({batch, heads, seq, dim}).transpose(1, 2).reshape({batch, seq, heads * dim});
}

}  // namespace

SyntheticTarget::SyntheticTarget(const core::ModelConfig& model,
                                 const core::SyntheticTargetConfig& target)
    : model_(model), target_(target) {
  const int64_t hidden = model.hidden_size, vocab = model.vocab_size;
  if (hidden <= 0 || vocab < 2) {
    fail("synthetic target needs model.hidden_size > 0 and model.vocab_size >= 2 (got {} and {})",
         hidden, vocab);
  }
  if (target.num_layers < 1 || target.intermediate_size < 1) {
    fail("data.synthetic.num_layers and data.synthetic.intermediate_size must be positive "
         "(got {} and {})", target.num_layers, target.intermediate_size);
  }
  if (target.num_attention_heads < 1 || target.num_key_value_heads < 1 ||
      target.num_attention_heads % target.num_key_value_heads != 0) {
    fail("data.synthetic.num_attention_heads ({}) must be a positive multiple of "
         "data.synthetic.num_key_value_heads ({})", target.num_attention_heads,
         target.num_key_value_heads);
  }
  if (target.head_dim < 2 || target.head_dim % 2 != 0) {
    fail("data.synthetic.head_dim must be even and >= 2 for RoPE (got {})", target.head_dim);
  }
  if (!(target.logit_scale > 0.0) || !(target.temperature > 0.0)) {
    fail("data.synthetic.logit_scale and data.synthetic.temperature must be > 0 (got {} and {})",
         target.logit_scale, target.temperature);
  }
  if (target.prompt_length < 0) {
    fail("data.synthetic.prompt_length must be >= 0 (got {})", target.prompt_length);
  }
  if (model.target_layer_ids.empty()) fail("model.target_layer_ids must not be empty");
  for (int64_t id : model.target_layer_ids) {
    if (id < 0 || id >= target.num_layers) {
      fail("model.target_layer_ids entry {} is outside the synthetic target's layers "
           "[0, data.synthetic.num_layers = {})", id, target.num_layers);
    }
  }
  if (model.mask_token_id >= vocab) {
    fail("model.mask_token_id {} is outside the vocabulary (model.vocab_size = {})",
         model.mask_token_id, vocab);
  }

  at::NoGradGuard no_grad;
  at::Generator gen = seeded_generator(static_cast<uint64_t>(target.seed));
  const int64_t q_width = target.num_attention_heads * target.head_dim;
  const int64_t kv_width = target.num_key_value_heads * target.head_dim;
  const int64_t inter = target.intermediate_size;
  const auto ones = [](int64_t n) { return at::ones({n}, at::TensorOptions().dtype(at::kFloat)); };
  // Input projections keep unit-RMS activations at unit scale; the residual branches (o_proj,
  // down_proj) add O(1) per layer, so the stream grows slowly and every layer still matters.
  embed_tokens_ = normal(gen, {vocab, hidden}, 1.0);
  for (int64_t l = 0; l < target.num_layers; ++l) {
    Layer layer;
    layer.input_norm = ones(hidden);
    layer.q_proj = normal(gen, {q_width, hidden}, 1.0 / std::sqrt(double(hidden)));
    layer.k_proj = normal(gen, {kv_width, hidden}, 1.0 / std::sqrt(double(hidden)));
    layer.v_proj = normal(gen, {kv_width, hidden}, 1.0 / std::sqrt(double(hidden)));
    layer.o_proj = normal(gen, {hidden, q_width}, 1.0 / std::sqrt(double(q_width)));
    layer.q_norm = ones(target.head_dim).mul_(kQueryNormGain);
    layer.k_norm = ones(target.head_dim);
    layer.post_attention_norm = ones(hidden);
    layer.gate_proj = normal(gen, {inter, hidden}, 1.0 / std::sqrt(double(hidden)));
    layer.up_proj = normal(gen, {inter, hidden}, 1.0 / std::sqrt(double(hidden)));
    layer.down_proj = normal(gen, {hidden, inter}, 1.0 / std::sqrt(double(inter)));
    layers_.push_back(std::move(layer));
  }
  final_norm_ = ones(hidden);
  // logit_scale is folded into the exported head, so softmax(target_last @ lm_headᵀ) — what a
  // draft sees as its teacher — is exactly the distribution the target samples from (at T = 1).
  const double head_std =
      kHeadGain * std::sqrt(2.0 * std::log(double(vocab))) / std::sqrt(double(hidden));
  lm_head_ = normal(gen, {vocab, hidden}, head_std * target.logit_scale);
}

at::Tensor SyntheticTarget::layer_forward(const Layer& layer, const at::Tensor& x) const {
  const int64_t batch = x.size(0), seq = x.size(1);
  const int64_t heads = target_.num_attention_heads, kv_heads = target_.num_key_value_heads;
  const int64_t dim = target_.head_dim;
  const double eps = model_.rms_norm_eps;

  auto h = rms_norm(x, layer.input_norm, eps);
  // Per-head RMSNorm of queries and keys (Qwen3 q_norm / k_norm), then RoPE.
  auto q = rms_norm(at::linear(h, layer.q_proj).view({batch, seq, heads, dim}), layer.q_norm, eps);
  auto k = rms_norm(at::linear(h, layer.k_proj).view({batch, seq, kv_heads, dim}), layer.k_norm, eps);
  auto v = at::linear(h, layer.v_proj).view({batch, seq, kv_heads, dim});
  auto attn = causal_gqa(apply_rope(q, model_.rope_theta), apply_rope(k, model_.rope_theta), v);
  auto out = x + at::linear(attn, layer.o_proj);

  h = rms_norm(out, layer.post_attention_norm, eps);
  auto mlp = at::silu(at::linear(h, layer.gate_proj)) * at::linear(h, layer.up_proj);
  return out + at::linear(mlp, layer.down_proj);
}

DraftBatch SyntheticTarget::run(const at::Tensor& input_ids) const {
  if (input_ids.dim() != 2 || input_ids.scalar_type() != at::kLong) {
    fail("synthetic target expects input_ids [B, S] int64, got [{}] {}",
         fmt::join(input_ids.sizes(), ", "), c10::toString(input_ids.scalar_type()));
  }
  const int64_t batch = input_ids.size(0), seq = input_ids.size(1);
  const int64_t vocab = model_.vocab_size;
  if (input_ids.numel() > 0 &&
      (input_ids.min().item<int64_t>() < 0 || input_ids.max().item<int64_t>() >= vocab)) {
    fail("synthetic target: input_ids outside the vocabulary [0, {})", vocab);
  }

  at::NoGradGuard no_grad;
  SerialCompute serial;  // the ops are tiny
  auto ids = input_ids.cpu().contiguous();
  auto x = embed_tokens_.index_select(0, ids.view({-1})).view({batch, seq, model_.hidden_size});
  std::vector<at::Tensor> outputs;  // outputs[l] = output of decoder layer l (dspine.md §2.1)
  outputs.reserve(layers_.size());
  for (const Layer& layer : layers_) {
    x = layer_forward(layer, x);
    outputs.push_back(x);
  }
  std::vector<at::Tensor> captured;
  for (int64_t id : model_.target_layer_ids) captured.push_back(outputs[id]);

  DraftBatch batch_out;
  batch_out.input_ids = ids;
  batch_out.loss_mask =
      at::arange(seq, at::TensorOptions().dtype(at::kLong)).ge(target_.prompt_length)
          .to(at::kLong).unsqueeze(0).expand({batch, seq}).contiguous();
  batch_out.hidden_states = at::cat(captured, -1);
  batch_out.target_last_hidden_states = rms_norm(x, final_norm_, model_.rms_norm_eps);
  return batch_out;
}

at::Tensor SyntheticTarget::logits(const at::Tensor& input_ids) const {
  at::NoGradGuard no_grad;
  return at::matmul(run(input_ids).target_last_hidden_states, lm_head_.t());
}

DraftBatch SyntheticTarget::sample(int64_t index, int64_t seq_len) const {
  if (index < 0) fail("synthetic target: sample index must be >= 0 (got {})", index);
  if (seq_len <= target_.prompt_length) {
    fail("data.seq_len ({}) must exceed data.synthetic.prompt_length ({}) so that some tokens are "
         "supervised", seq_len, target_.prompt_length);
  }
  at::NoGradGuard no_grad;
  SerialCompute serial;
  const int64_t vocab = model_.vocab_size;
  // The draft fills its proposal slots with the mask token; keep it out of the data, as a real
  // tokenizer's reserved mask id would be.
  const int64_t mask_id = model_.mask_token_id < 0 ? vocab - 1 : model_.mask_token_id;
  at::Generator gen = seeded_generator(stream_seed(target_.seed, index));

  auto ids = at::zeros({1, seq_len}, at::TensorOptions().dtype(at::kLong));
  auto ids_acc = ids.accessor<int64_t, 2>();
  int64_t first = at::randint(vocab - 1, {1}, gen, at::TensorOptions().dtype(at::kLong)).item<int64_t>();
  ids_acc[0][0] = first >= mask_id ? first + 1 : first;
  for (int64_t t = 1; t < seq_len; ++t) {
    // One full forward of the prefix per position keeps a single forward path (no KV cache);
    // at the default sizes a 64-token sample costs a few tens of milliseconds on one core.
    auto last = run(ids.narrow(1, 0, t)).target_last_hidden_states.select(1, t - 1);
    auto logits_t = at::matmul(last, lm_head_.t()).div_(target_.temperature);
    logits_t.select(1, mask_id).fill_(-std::numeric_limits<float>::infinity());
    ids_acc[0][t] = at::multinomial(at::softmax(logits_t, -1), 1, false, gen).item<int64_t>();
  }
  return run(ids);
}

}  // namespace dspine::data
