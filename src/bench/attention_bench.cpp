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

void run_attention_bench(const AttentionOptions& o) {
  if (!torch::cuda::is_available()) fail("dspine-bench attention needs a CUDA device");
  if (!ops::block_attention_heads_supported(o.heads, o.kv_heads, o.head_dim, o.block_size)) {
    fail("dspine-bench attention: the block kernels do not take heads {}/{}, head_dim {}, "
         "block size {}",
         o.heads, o.kv_heads, o.head_dim, o.block_size);
  }
  if (o.blocks > o.context - 1) fail("dspine-bench attention: --blocks must be < --context");
  torch::manual_seed(0);
  const int64_t queries = o.blocks * o.block_size, keys = o.context + queries;
  auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  auto q = torch::randn({o.rows, queries, o.heads, o.head_dim}, bf16);
  auto k = torch::randn({o.rows, keys, o.kv_heads, o.head_dim}, bf16);
  auto v = torch::randn({o.rows, keys, o.kv_heads, o.head_dim}, bf16);
  auto dout = torch::randn({o.rows, queries, o.heads, o.head_dim}, bf16);
  // Distinct anchors drawn uniformly from the valid positions 0..S-2 and sorted, as the trainer's.
  std::vector<torch::Tensor> rows;
  for (int64_t b = 0; b < o.rows; ++b) {
    rows.push_back(std::get<0>(torch::randperm(o.context - 1).slice(0, 0, o.blocks).sort()));
  }
  auto anchors = torch::stack(rows).to(torch::kCUDA);
  auto keep = torch::ones({o.rows, o.blocks}, torch::TensorOptions(torch::kCUDA).dtype(torch::kBool));
  const double scale = 1.0 / std::sqrt(static_cast<double>(o.head_dim));

  // Visible pairs per query head: each block's bs queries see its anchor's prefix, plus the
  // bs(bs+1)/2 causal pairs inside the block.
  const double pairs = static_cast<double>(o.block_size) * anchors.sum().item<double>() +
                       static_cast<double>(o.rows * o.blocks * o.block_size * (o.block_size + 1) / 2);
  const double dense_pairs = static_cast<double>(o.rows * queries * keys);
  const double forward_flop = 4.0 * pairs * static_cast<double>(o.heads * o.head_dim);
  const double both_flop = 3.5 * forward_flop;

  const double gemm_tflops = bf16_gemm_tflops();
  AttentionFn fused = [&](const torch::Tensor& ql, const torch::Tensor& kl,
                          const torch::Tensor& vl) {
    return ops::block_attention(ql, kl, vl, anchors, keep, o.block_size, scale);
  };
  const Timing f = time_attention(fused, q, k, v, dout, o.iterations);
  Timing r;
  if (o.reference) {
    const auto mask = model::prepare_attention_mask(
        model::block_attention_mask(anchors, keep, o.context, o.block_size));
    AttentionFn dense = [&](const torch::Tensor& ql, const torch::Tensor& kl,
                            const torch::Tensor& vl) {
      return model::masked_attention(ql, kl, vl, mask, scale);
    };
    r = time_attention(dense, q, k, v, dout, o.iterations);
  }

  std::printf("shape: rows %lld, context %lld, blocks %lld x %lld, heads %lld/%lld, head_dim %lld\n",
              static_cast<long long>(o.rows), static_cast<long long>(o.context),
              static_cast<long long>(o.blocks), static_cast<long long>(o.block_size),
              static_cast<long long>(o.heads), static_cast<long long>(o.kv_heads),
              static_cast<long long>(o.head_dim));
  std::printf("visible_fraction: %.4f of the query-key pairs\n", pairs / dense_pairs);
  std::printf("useful_gflop: forward %.1f, forward+backward %.1f\n", forward_flop / 1e9,
              both_flop / 1e9);
  std::printf("bf16_gemm_tflops: %.1f\n", gemm_tflops);
  std::printf("| path | forward ms | forward+backward ms | TFLOP/s fwd | TFLOP/s fwd+bwd | of GEMM rate | peak extra GiB |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  auto row = [&](const char* name, const Timing& t) {
    const double tf_fwd = forward_flop / (t.forward_ms * 1e-3) / 1e12;
    const double tf_both = both_flop / (t.both_ms * 1e-3) / 1e12;
    std::printf("| %s | %.3f | %.3f | %.1f | %.1f | %.1f%% | %.2f |\n", name, t.forward_ms,
                t.both_ms, tf_fwd, tf_both, 100.0 * tf_both / gemm_tflops, t.peak_gib);
  };
  row("fused block kernels", f);
  if (o.reference) {
    row("dense masked SDPA, repeated kv", r);
    std::printf("speedup_forward_backward: %.2fx\n", r.both_ms / f.both_ms);
  }
  if (kernels::block_attention_wgmma_available(o.head_dim)) {
    // The kernels alone with each instruction set (the fused rows above use wgmma).
    const kernels::BlockAttentionShape shape{o.rows,  o.context, o.blocks,  o.block_size,
                                             o.heads, o.kv_heads, o.head_dim};
    auto out = torch::empty_like(q), dq = torch::empty_like(q);
    auto dk = torch::empty_like(k), dv = torch::empty_like(v);
    auto lse = torch::empty({o.rows, queries, o.heads}, q.options().dtype(torch::kFloat32));
    auto delta = torch::empty_like(lse);
    const auto keep_bytes = keep.to(torch::kUInt8);
    const auto stream = at::cuda::getCurrentCUDAStream();
    auto check = [](cudaError_t status) {
      if (status != cudaSuccess) fail("dspine-bench attention: {}", cudaGetErrorString(status));
    };
    auto forward = [&](kernels::AttentionInstructions instructions) {
      check(kernels::block_attention_forward(
          shape, q.data_ptr(), k.data_ptr(), v.data_ptr(), anchors.data_ptr<int64_t>(),
          keep_bytes.data_ptr<uint8_t>(), static_cast<float>(scale), out.data_ptr(),
          lse.data_ptr<float>(), stream, instructions));
    };
    auto backward = [&](kernels::AttentionInstructions instructions) {
      check(kernels::block_attention_backward(
          shape, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dout.data_ptr(),
          lse.data_ptr<float>(), anchors.data_ptr<int64_t>(), keep_bytes.data_ptr<uint8_t>(),
          static_cast<float>(scale), delta.data_ptr<float>(), dq.data_ptr(), dk.data_ptr(),
          dv.data_ptr(), stream, instructions));
    };
    const double backward_flop = both_flop - forward_flop;
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
                  name, f_ms, forward_flop / (f_ms * 1e-3) / 1e12, b_ms,
                  backward_flop / (b_ms * 1e-3) / 1e12);
    }
  }
  // The op once more, last: against its first timing (right after the GEMM-rate measurement),
  // what the order of the measurements costs it.
  const Timing again = time_attention(fused, q, k, v, dout, o.iterations);
  std::printf("fused_timed_last: forward %.3f ms, forward+backward %.3f ms (%.1f TFLOP/s)\n",
              again.forward_ms, again.both_ms, both_flop / (again.both_ms * 1e-3) / 1e12);
  // One op call (forward + backward) profiled: its kernels against its wall time show whether
  // the op's extra time is in its kernels or between them.
  {
    auto ql = q.detach().requires_grad_(true), kl = k.detach().requires_grad_(true),
         vl = v.detach().requires_grad_(true);
    start_kernel_profile(true);
    fused(ql, kl, vl).backward(dout);
    torch::cuda::synchronize();
    KernelProfile profile = stop_kernel_profile(o.profile_trace);
    profile.wall_ms = again.both_ms;
    std::printf("\nthe op, forward + backward, one call profiled (wall: fused_timed_last)\n");
    print_kernel_profile(profile, stdout, 8);
  }
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
