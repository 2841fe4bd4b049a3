#include "data/synthetic_target.h"

#include <limits>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/ParallelGuard.h>

#include "core/error.h"
#include "core/seeding.h"

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

at::Generator seeded_generator(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(core::generator_seed(seed));
}

// The target's dimensions, checked with the configuration keys they come from.
target::Qwen3Dims synthetic_dims(const core::ModelConfig& model,
                                 const core::SyntheticTargetConfig& target) {
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

  target::Qwen3Dims dims;
  dims.hidden_size = hidden;
  dims.intermediate_size = target.intermediate_size;
  dims.num_hidden_layers = target.num_layers;
  dims.num_attention_heads = target.num_attention_heads;
  dims.num_key_value_heads = target.num_key_value_heads;
  dims.head_dim = target.head_dim;
  dims.vocab_size = vocab;
  dims.rms_norm_eps = model.rms_norm_eps;
  dims.rope_theta = model.rope_theta;
  dims.tie_word_embeddings = false;
  return dims;
}

}  // namespace

SyntheticTarget::SyntheticTarget(const core::ModelConfig& model,
                                 const core::SyntheticTargetConfig& target)
    : parts_{model, target,
             target::Qwen3Model::random(synthetic_dims(model, target),
                                        static_cast<uint64_t>(target.seed), at::kFloat,
                                        c10::Device(c10::kCPU)),
             at::Tensor()} {
  // logit_scale is folded into the exported head, so softmax(target_last @ lm_headᵀ) — what a
  // draft sees as its teacher — is exactly the distribution the target samples from (T = 1).
  parts_.lm_head = parts_.target_model.lm_head() * target.logit_scale;
}

DraftBatch SyntheticTarget::run(const at::Tensor& input_ids) const {
  return run(parts_, input_ids);
}

DraftBatch SyntheticTarget::run(const Parts& parts, const at::Tensor& input_ids) {
  at::NoGradGuard no_grad;
  SerialCompute serial;  // the ops are tiny
  const auto ids = input_ids.cpu().contiguous();
  const target::Qwen3Model::Outputs out =
      parts.target_model.forward(ids, parts.model.target_layer_ids);
  const int64_t batch = ids.size(0), seq = ids.size(1);
  DraftBatch batch_out;
  batch_out.input_ids = ids;
  batch_out.loss_mask =
      at::arange(seq, at::TensorOptions().dtype(at::kLong)).ge(parts.target.prompt_length)
          .to(at::kLong).unsqueeze(0).expand({batch, seq}).contiguous();
  batch_out.hidden_states = out.hidden_states;
  batch_out.target_last_hidden_states = out.last_hidden_state;
  return batch_out;
}

at::Tensor SyntheticTarget::logits(const at::Tensor& input_ids) const {
  at::NoGradGuard no_grad;
  return at::matmul(run(input_ids).target_last_hidden_states, parts_.lm_head.t());
}

DraftBatch SyntheticTarget::sample(int64_t index, int64_t seq_len) const {
  if (index < 0) fail("synthetic target: sample index must be >= 0 (got {})", index);
  if (seq_len <= parts_.target.prompt_length) {
    fail("data.seq_len ({}) must exceed data.synthetic.prompt_length ({}) so that some tokens are "
         "supervised", seq_len, parts_.target.prompt_length);
  }
  const int64_t group = index / kSampleGroup;
  std::lock_guard<std::mutex> lock(memo_->mutex);
  GroupMemo& memo = *memo_;
  if (memo.group != group || memo.seq_len != seq_len) {
    const bool prefetched = memo.next.valid() && memo.next_group == group &&
                            memo.next_seq_len == seq_len;
    memo.samples = prefetched ? memo.next.get() : decode_group(parts_, group, seq_len);
    memo.group = group;
    memo.seq_len = seq_len;
    if (memo.next.valid()) memo.next.wait();  // a prefetch that missed: let it finish first
    memo.next_group = group + 1;
    memo.next_seq_len = seq_len;
    memo.next = std::async(std::launch::async, [parts = parts_, group, seq_len] {
      return decode_group(parts, group + 1, seq_len);
    });
  }
  return memo.samples[static_cast<size_t>(index % kSampleGroup)];
}

std::vector<DraftBatch> SyntheticTarget::decode_group(const Parts& parts, int64_t group,
                                                      int64_t seq_len) {
  at::NoGradGuard no_grad;
  SerialCompute serial;
  const int64_t vocab = parts.model.vocab_size, rows = kSampleGroup;
  // The draft fills its proposal slots with the mask token; keep it out of the data, as a real
  // tokenizer's reserved mask id would be.
  const int64_t mask_id = parts.model.mask_token_id < 0 ? vocab - 1 : parts.model.mask_token_id;

  // Every random number of sample i comes from its own stream: the first token and one uniform
  // per position, which picks the next token by inverting the row's cumulative distribution.
  auto ids = at::zeros({rows, seq_len}, at::TensorOptions().dtype(at::kLong));
  std::vector<at::Tensor> uniforms;
  for (int64_t r = 0; r < rows; ++r) {
    at::Generator gen = seeded_generator(core::stream_seed(parts.target.seed, group * rows + r));
    const int64_t first =
        at::randint(vocab - 1, {1}, gen, at::TensorOptions().dtype(at::kLong)).item<int64_t>();
    ids[r][0] = first >= mask_id ? first + 1 : first;
    uniforms.push_back(at::rand({seq_len}, gen, at::TensorOptions().dtype(at::kDouble)));
  }
  const auto uniform = at::stack(uniforms);  // [rows, seq_len]

  // Incremental decoding of the whole group: each position runs only the newest tokens against
  // the cached keys and values of the prefixes.
  target::Qwen3Model::KvCache cache = parts.target_model.new_cache(rows, seq_len);
  for (int64_t t = 1; t < seq_len; ++t) {
    const auto last =
        parts.target_model.step(ids.narrow(1, t - 1, 1), cache).last_hidden_state.select(1, 0);
    auto logits = at::matmul(last, parts.lm_head.t()).div_(parts.target.temperature);
    logits.select(1, mask_id).fill_(-std::numeric_limits<float>::infinity());
    // The first token whose cumulative probability exceeds u * total has a non-zero probability,
    // so the mask token (probability 0) is never drawn. Double keeps the sums exact enough.
    const auto cdf = at::softmax(logits, -1).to(at::kDouble).cumsum(-1);
    const auto threshold = uniform.select(1, t).mul(cdf.select(1, vocab - 1)).unsqueeze(1);
    ids.select(1, t).copy_(cdf.le(threshold).sum(-1).clamp_max(vocab - 1));
  }
  // One full forward of the group gives every sample's hidden states (run() on the group).
  const DraftBatch all = run(parts, ids);
  std::vector<DraftBatch> samples;
  for (int64_t r = 0; r < rows; ++r) {
    DraftBatch one = all.slice_rows(r, r + 1);
    for (auto* t : {&one.input_ids, &one.loss_mask, &one.hidden_states,
                    &one.target_last_hidden_states}) {
      *t = t->clone();  // own storage: a kept sample must not pin the whole group
    }
    samples.push_back(std::move(one));
  }
  return samples;
}

}  // namespace dspine::data
