// `dspine-bench attention`: the DSpine block attention of one layer at a given shape (default: the
// recipe's, configs/qwen3-8b-dspine.yaml), fused block kernels against the dense masked SDPA
// reference the draft used before (kv heads repeated), forward and forward + backward, in bf16.
// FLOP are counted on the visible query-key pairs only (4·D per pair and head forward, 2.5× that
// backward, the usual flash-attention convention; our backward also recomputes the scores once
// more for dq, which is not counted), so TFLOP/s is useful work per second; the bf16 GEMM rate of
// the same run is the yardstick.
#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include <ATen/cuda/CUDAContext.h>
#include <CLI/CLI.hpp>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/torch.h>

#include "bench/bench.h"
#include "bench/cuda_timing.h"
#include "bench/kernel_profile.h"
#include "core/error.h"
#include "kernels/block_attention.h"
#include "model/attention.h"
#include "model/block_mask.h"
#include "ops/block_attention_ops.h"

namespace dspine::bench {
namespace {

struct AttentionOptions {
  int64_t rows = 2, context = 3072, blocks = 512, block_size = 16;
  int64_t heads = 32, kv_heads = 8, head_dim = 128;
  int iterations = 20;
  bool reference = true;
  std::string profile_trace;  // where to save the Chrome trace of the profiled op call ("": none)
};

// Untimed calls before each timed series (clocks settle after the GEMM-rate measurement).
constexpr int kWarmups = 5;

struct Timing {
  double forward_ms = 0, both_ms = 0, peak_gib = 0;
};

// Peak allocated bytes above what was held before `fn`, in GiB.
double peak_extra_gib(const std::function<void()>& fn) {
  torch::cuda::synchronize();
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  const int64_t base = stats.allocated_bytes[0].current;
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  fn();
  torch::cuda::synchronize();
  const int64_t peak = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].peak;
  return static_cast<double>(peak - base) / static_cast<double>(int64_t(1) << 30);
}

using AttentionFn =
    std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>;

Timing time_attention(const AttentionFn& attend, const torch::Tensor& q, const torch::Tensor& k,
                      const torch::Tensor& v, const torch::Tensor& dout, int iterations) {
  auto ql = q.detach().requires_grad_(true), kl = k.detach().requires_grad_(true),
       vl = v.detach().requires_grad_(true);
  auto both = [&] {
    ql.mutable_grad() = torch::Tensor();
    kl.mutable_grad() = torch::Tensor();
    vl.mutable_grad() = torch::Tensor();
    attend(ql, kl, vl).backward(dout);
  };
  Timing t;
  {
    torch::NoGradGuard no_grad;
    t.forward_ms = cuda_median_ms([&] { attend(q, k, v); }, kWarmups, iterations);
  }
  t.both_ms = cuda_median_ms(both, kWarmups, iterations);
  t.peak_gib = peak_extra_gib(both);
  return t;
}

void check_attention_options(const AttentionOptions& o) {
  if (!torch::cuda::is_available()) fail("dspine-bench attention needs a CUDA device");
  if (!ops::block_attention_heads_supported(o.heads, o.kv_heads, o.head_dim, o.block_size)) {
    fail("dspine-bench attention: the block kernels do not take heads {}/{}, head_dim {}, "
         "block size {}",
         o.heads, o.kv_heads, o.head_dim, o.block_size);
  }
  if (o.blocks > o.context - 1) fail("dspine-bench attention: --blocks must be < --context");
}

// One layer's random bf16 q, k, v and upstream gradient, with anchors placed as the trainer's.
struct AttentionInputs {
  int64_t queries = 0, keys = 0;
  torch::Tensor q, k, v, dout, anchors, keep;
  double scale = 0;
};

AttentionInputs make_attention_inputs(const AttentionOptions& o) {
  AttentionInputs in;
  in.queries = o.blocks * o.block_size;
  in.keys = o.context + in.queries;
  auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  in.q = torch::randn({o.rows, in.queries, o.heads, o.head_dim}, bf16);
  in.k = torch::randn({o.rows, in.keys, o.kv_heads, o.head_dim}, bf16);
  in.v = torch::randn({o.rows, in.keys, o.kv_heads, o.head_dim}, bf16);
  in.dout = torch::randn({o.rows, in.queries, o.heads, o.head_dim}, bf16);
  // Distinct anchors drawn uniformly from the valid positions 0..S-2 and sorted, as the trainer's.
  std::vector<torch::Tensor> rows;
  for (int64_t b = 0; b < o.rows; ++b) {
    rows.push_back(std::get<0>(torch::randperm(o.context - 1).slice(0, 0, o.blocks).sort()));
  }
  in.anchors = torch::stack(rows).to(torch::kCUDA);
  in.keep = torch::ones({o.rows, o.blocks}, torch::TensorOptions(torch::kCUDA).dtype(torch::kBool));
  in.scale = 1.0 / std::sqrt(static_cast<double>(o.head_dim));
  return in;
}

// Useful work: the visible query-key pairs (per query head) against all of them, and the FLOP on
// the visible ones.
struct AttentionWork {
  double pairs = 0, dense_pairs = 0, forward_flop = 0, both_flop = 0;
};

AttentionWork count_useful_work(const AttentionOptions& o, const AttentionInputs& in) {
  AttentionWork w;
  // Visible pairs per query head: each block's bs queries see its anchor's prefix, plus the
  // bs(bs+1)/2 causal pairs inside the block.
  w.pairs = static_cast<double>(o.block_size) * in.anchors.sum().item<double>() +
            static_cast<double>(o.rows * o.blocks * o.block_size * (o.block_size + 1) / 2);
  w.dense_pairs = static_cast<double>(o.rows * in.queries * in.keys);
  w.forward_flop = 4.0 * w.pairs * static_cast<double>(o.heads * o.head_dim);
  w.both_flop = 3.5 * w.forward_flop;
  return w;
}

AttentionFn fused_block_attention(const AttentionInputs& in, int64_t block_size) {
  return
      [&in, block_size](const torch::Tensor& ql, const torch::Tensor& kl, const torch::Tensor& vl) {
        return ops::block_attention(ql, kl, vl, in.anchors, in.keep, block_size, in.scale);
      };
}

// The dense masked SDPA reference (kv heads repeated) under the same mask as the block kernels.
Timing time_dense_reference(const AttentionOptions& o, const AttentionInputs& in) {
  const auto mask = model::prepare_attention_mask(
      model::block_attention_mask(in.anchors, in.keep, o.context, o.block_size));
  AttentionFn dense = [&](const torch::Tensor& ql, const torch::Tensor& kl,
                          const torch::Tensor& vl) {
    return model::masked_attention(ql, kl, vl, mask, in.scale);
  };
  return time_attention(dense, in.q, in.k, in.v, in.dout, o.iterations);
}

void print_attention_table(const AttentionOptions& o, const AttentionWork& w, double gemm_tflops,
                           const Timing& fused, const Timing& reference) {
  std::printf("shape: rows %lld, context %lld, blocks %lld x %lld, heads %lld/%lld, head_dim %lld\n",
              static_cast<long long>(o.rows), static_cast<long long>(o.context),
              static_cast<long long>(o.blocks), static_cast<long long>(o.block_size),
              static_cast<long long>(o.heads), static_cast<long long>(o.kv_heads),
              static_cast<long long>(o.head_dim));
  std::printf("visible_fraction: %.4f of the query-key pairs\n", w.pairs / w.dense_pairs);
  std::printf("useful_gflop: forward %.1f, forward+backward %.1f\n", w.forward_flop / 1e9,
              w.both_flop / 1e9);
  std::printf("bf16_gemm_tflops: %.1f\n", gemm_tflops);
  std::printf("| path | forward ms | forward+backward ms | TFLOP/s fwd | TFLOP/s fwd+bwd | of GEMM rate | peak extra GiB |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  auto row = [&](const char* name, const Timing& t) {
    const double tf_fwd = w.forward_flop / (t.forward_ms * 1e-3) / 1e12;
    const double tf_both = w.both_flop / (t.both_ms * 1e-3) / 1e12;
    std::printf("| %s | %.3f | %.3f | %.1f | %.1f | %.1f%% | %.2f |\n", name, t.forward_ms,
                t.both_ms, tf_fwd, tf_both, 100.0 * tf_both / gemm_tflops, t.peak_gib);
  };
  row("fused block kernels", fused);
  if (o.reference) {
    row("dense masked SDPA, repeated kv", reference);
    std::printf("speedup_forward_backward: %.2fx\n", reference.both_ms / fused.both_ms);
  }
}

// The kernels alone with each instruction set (the fused rows of the table use wgmma): forward
// and backward back to back, then each on its own.
void time_kernels_alone(const AttentionOptions& o, const AttentionInputs& in,
                        const AttentionWork& w) {
  const kernels::BlockAttentionShape shape{o.rows,  o.context,  o.blocks,  o.block_size,
                                           o.heads, o.kv_heads, o.head_dim};
  auto out = torch::empty_like(in.q), dq = torch::empty_like(in.q);
  auto dk = torch::empty_like(in.k), dv = torch::empty_like(in.v);
  auto lse = torch::empty({o.rows, in.queries, o.heads}, in.q.options().dtype(torch::kFloat32));
  auto delta = torch::empty_like(lse);
  const auto keep_bytes = in.keep.to(torch::kUInt8);
  const auto stream = at::cuda::getCurrentCUDAStream();
  const auto scale = static_cast<float>(in.scale);
  auto check = [](cudaError_t status) {
    if (status != cudaSuccess) fail("dspine-bench attention: {}", cudaGetErrorString(status));
  };
  auto forward = [&](kernels::AttentionInstructions instructions) {
    check(kernels::block_attention_forward(shape, in.q.data_ptr(), in.k.data_ptr(), in.v.data_ptr(),
                                           in.anchors.data_ptr<int64_t>(),
                                           keep_bytes.data_ptr<uint8_t>(), scale, out.data_ptr(),
                                           lse.data_ptr<float>(), stream, instructions));
  };
  auto backward = [&](kernels::AttentionInstructions instructions) {
    check(kernels::block_attention_backward(
        shape, in.q.data_ptr(), in.k.data_ptr(), in.v.data_ptr(), out.data_ptr(),
        in.dout.data_ptr(), lse.data_ptr<float>(), in.anchors.data_ptr<int64_t>(),
        keep_bytes.data_ptr<uint8_t>(), scale, delta.data_ptr<float>(), dq.data_ptr(),
        dk.data_ptr(), dv.data_ptr(), stream, instructions));
  };
  const double backward_flop = w.both_flop - w.forward_flop;
  // Forward and backward back to back, as the op runs them: the op's extra time is measured
  // against this, not against the two separate medians.
  const double pair_ms = cuda_median_ms(
      [&] {
        forward(kernels::AttentionInstructions::kAutomatic);
        backward(kernels::AttentionInstructions::kAutomatic);
      },
      kWarmups, o.iterations);
  std::printf("kernels_wgmma_back_to_back: forward+backward %.3f ms\n", pair_ms);
  using Set = std::pair<const char*, kernels::AttentionInstructions>;
  for (const Set& set : {Set{"wgmma", kernels::AttentionInstructions::kAutomatic},
                         Set{"mma.sync", kernels::AttentionInstructions::kMmaSync}}) {
    const char* name = set.first;
    const kernels::AttentionInstructions instructions = set.second;
    const double f_ms = cuda_median_ms([&] { forward(instructions); }, kWarmups, o.iterations);
    const double b_ms = cuda_median_ms([&] { backward(instructions); }, kWarmups, o.iterations);
    std::printf("kernels_%s: forward %.3f ms (%.1f TFLOP/s), backward %.3f ms (%.1f TFLOP/s)\n",
                name, f_ms, w.forward_flop / (f_ms * 1e-3) / 1e12, b_ms,
                backward_flop / (b_ms * 1e-3) / 1e12);
  }
}

// One op call (forward + backward) profiled: its kernels against its wall time show whether the
// op's extra time is in its kernels or between them.
void profile_op_call(const AttentionFn& fused, const AttentionInputs& in,
                     const std::string& trace_path, double wall_ms) {
  auto ql = in.q.detach().requires_grad_(true), kl = in.k.detach().requires_grad_(true),
       vl = in.v.detach().requires_grad_(true);
  start_kernel_profile(true);
  fused(ql, kl, vl).backward(in.dout);
  torch::cuda::synchronize();
  KernelProfile profile = stop_kernel_profile(trace_path);
  profile.wall_ms = wall_ms;
  std::printf("\nthe op, forward + backward, one call profiled (wall: fused_timed_last)\n");
  print_kernel_profile(profile, stdout, 8);
}

void run_attention_bench(const AttentionOptions& o) {
  check_attention_options(o);
  torch::manual_seed(0);
  const AttentionInputs in = make_attention_inputs(o);
  const AttentionWork work = count_useful_work(o, in);
  const double gemm_tflops = bf16_gemm_tflops();
  const AttentionFn fused = fused_block_attention(in, o.block_size);
  const Timing f = time_attention(fused, in.q, in.k, in.v, in.dout, o.iterations);
  Timing r;
  if (o.reference) r = time_dense_reference(o, in);
  print_attention_table(o, work, gemm_tflops, f, r);
  if (kernels::block_attention_wgmma_available(o.head_dim)) time_kernels_alone(o, in, work);
  // The op once more, last: against its first timing (right after the GEMM-rate measurement),
  // what the order of the measurements costs it.
  const Timing again = time_attention(fused, in.q, in.k, in.v, in.dout, o.iterations);
  std::printf("fused_timed_last: forward %.3f ms, forward+backward %.3f ms (%.1f TFLOP/s)\n",
              again.forward_ms, again.both_ms, work.both_flop / (again.both_ms * 1e-3) / 1e12);
  profile_op_call(fused, in, o.profile_trace, again.both_ms);
}

}  // namespace

void register_attention_bench(CLI::App& app) {
  auto o = std::make_shared<AttentionOptions>();
  auto* cmd = app.add_subcommand(
      "attention", "DSpine block attention of one layer: fused block kernels vs dense masked SDPA");
  cmd->add_option("--rows", o->rows, "batch rows")->check(CLI::PositiveNumber);
  cmd->add_option("--context", o->context, "context length S")->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--blocks", o->blocks, "anchors per row")->check(CLI::PositiveNumber);
  cmd->add_option("--block-size", o->block_size, "block size")->check(CLI::PositiveNumber);
  cmd->add_option("--heads", o->heads, "query heads")->check(CLI::PositiveNumber);
  cmd->add_option("--kv-heads", o->kv_heads, "key/value heads")->check(CLI::PositiveNumber);
  cmd->add_option("--head-dim", o->head_dim, "head dimension (64 or 128)");
  cmd->add_option("--iters", o->iterations, "timed calls (the median is reported)")
      ->check(CLI::Range(1, 1000));
  cmd->add_flag("!--no-reference", o->reference, "skip the dense reference");
  cmd->add_option("--profile-trace", o->profile_trace,
                  "save the Chrome trace of the profiled op call to this path");
  cmd->callback([o] { run_attention_bench(*o); });
}

}  // namespace dspine::bench
