// `dspine-bench vocab`: the DSpine backbone vocabulary terms (teacher, CE, L1, top-k candidates and
// the teacher's probabilities there, the hidden gradient) at the recipe's size in bf16 — the fused
// vocabulary objective (ops/vocab_objective_ops.h) against the reference chunk function
// (objectives/dspine_terms.h, backbone_terms) under checkpointed chunks as the objective runs it,
// forward + backward. The teacher states come as the objective passes them: one per target
// position of `--batch` rows of `--seq-len`, read by the proposals of sorted random anchors, whose
// blocks overlap; the fused objective is timed reading them by position (each chunk projects a
// position once) and gathered per proposal row. One [rows, H] x [H, V] logits GEMM is timed in the
// same run, so each path is also reported as a multiple of one GEMM pass; one more fused call runs
// under the kernel profiler to show where its time goes (GEMMs against the row kernel).
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include <CLI/CLI.hpp>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/torch.h>

#include "bench/bench.h"
#include "bench/cuda_timing.h"
#include "bench/kernel_profile.h"
#include "core/error.h"
#include "objectives/chunking.h"
#include "objectives/dspine_blocks.h"
#include "objectives/dspine_terms.h"
#include "ops/vocab_objective_ops.h"

namespace dspine::bench {
namespace {

struct Options {
  int64_t rows = 15360;  // 2 rows x 512 anchors x 15 proposals
  int64_t batch = 2;
  int64_t seq_len = 3072;
  int64_t hidden = 4096;
  int64_t vocab = 151936;
  int64_t top_k = 16;
  int64_t proposals = 15;       // rows per block (the reference chunks blocks)
  int64_t chunk_blocks = 128;   // objective.dspine.objective_chunk_blocks of the recipe
  double ce_weight = 0.1;
  int iterations = 5;
};

// Peak bytes allocated during fn beyond what was held before it and the `output_bytes` it keeps.
double peak_above_gib(const std::function<void()>& fn, int64_t output_bytes) {
  torch::cuda::synchronize();
  const auto device = c10::cuda::current_device();
  c10::cuda::CUDACachingAllocator::resetPeakStats(device);
  const auto stats = [&] { return c10::cuda::CUDACachingAllocator::getDeviceStats(device); };
  const auto before = stats().allocated_bytes[0].current;
  fn();
  torch::cuda::synchronize();
  return double(stats().allocated_bytes[0].peak - before - output_bytes) / double(int64_t(1) << 30);
}

// Anchors per sequence: --rows must split into --batch x anchors x --proposals.
int64_t anchors_per_row(const Options& o) {
  if (o.rows % o.proposals != 0) {
    fail("dspine-bench vocab: --rows ({}) must be a multiple of --proposals ({})", o.rows,
         o.proposals);
  }
  const int64_t anchors = o.rows / o.proposals / std::max<int64_t>(o.batch, 1);
  if (o.batch < 1 || anchors * o.proposals * o.batch != o.rows || anchors > o.seq_len - 1) {
    fail("dspine-bench vocab: --rows ({}) must be --batch ({}) x anchors x --proposals ({}), with "
         "at most --seq-len - 1 ({}) anchors per row",
         o.rows, o.batch, o.proposals, o.seq_len - 1);
  }
  return anchors;
}

// The objective's inputs on the GPU; `teacher` is `states` gathered per proposal row by
// `teacher_index`.
struct VocabInputs {
  at::Tensor lm_head, hidden, states, teacher_index, teacher, labels, weights, supervised;
};

VocabInputs make_inputs(const Options& o, int64_t anchors) {
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  const auto bf16 = cuda.dtype(torch::kBFloat16);
  VocabInputs in;
  in.lm_head = (torch::randn({o.vocab, o.hidden}, cuda) * 0.02).to(torch::kBFloat16);
  in.hidden = torch::randn({o.rows, o.hidden}, bf16).requires_grad_(true);
  in.states = torch::randn({o.batch * o.seq_len, o.hidden}, bf16);
  // Distinct anchors, sorted per row, as objectives::sample_anchors draws them.
  const auto shuffled = std::get<1>(torch::rand({o.batch, o.seq_len - 1}, cuda).sort(1));
  const auto anchor_starts = std::get<0>(shuffled.slice(1, 0, anchors).sort(1));
  const auto source_index =
      (anchor_starts.unsqueeze(-1) + torch::arange(o.proposals + 1, anchor_starts.options()))
          .clamp_max(o.seq_len - 1);
  in.teacher_index = objectives::teacher_positions(source_index, o.seq_len).reshape({-1});
  in.teacher = in.states.index_select(0, in.teacher_index);
  in.labels = torch::randint(o.vocab, {o.rows}, cuda.dtype(torch::kInt64));
  in.weights = torch::rand({o.rows}, cuda);
  in.supervised = torch::ones({o.rows}, cuda.dtype(torch::kBool));
  return in;
}

// `t` with its rows grouped in blocks of `proposals`: [rows, ...] -> [rows / proposals, proposals,
// ...], the layout the reference chunks take.
at::Tensor as_blocks(const at::Tensor& t, int64_t proposals) {
  auto sizes = t.sizes().vec();
  sizes[0] = proposals;
  sizes.insert(sizes.begin(), -1);
  return t.view(sizes);
}

// One forward + backward of the reference chunk function under checkpointed chunks, as the
// objective runs it; returns the loss.
at::Tensor reference_chunks_loss(VocabInputs& in, const Options& o) {
  in.hidden.mutable_grad() = at::Tensor();
  auto sums = objectives::checkpointed_chunk_reduce(
      [&](const std::vector<at::Tensor>& c) {
        auto b = objectives::backbone_terms(c[0], c[1], c[2], c[3], c[4], in.lm_head, o.top_k);
        return std::vector<at::Tensor>{b.ce, b.l1, b.correct};
      },
      {as_blocks(in.hidden, o.proposals), as_blocks(in.teacher, o.proposals),
       as_blocks(in.labels, o.proposals), as_blocks(in.weights, o.proposals),
       as_blocks(in.supervised, o.proposals)},
      o.chunk_blocks, {});
  auto loss = o.ce_weight * sums[0] + (1.0 - o.ce_weight) * sums[1];
  loss.backward();
  return loss.detach();
}

// One forward + backward of the fused objective; `teacher_index` undefined: `teacher_hidden`
// holds one row per proposal row.
at::Tensor fused_loss(VocabInputs& in, const at::Tensor& teacher_hidden,
                      const ops::VocabObjectiveOptions& options, const at::Tensor& teacher_index) {
  in.hidden.mutable_grad() = at::Tensor();
  auto r = ops::vocab_objective(in.hidden, teacher_hidden, in.labels, in.weights, in.lm_head,
                                options, teacher_index);
  r.loss.backward();
  return r.loss.detach();
}

struct PathResult {
  double ms = 0, peak_gib = 0;
  at::Tensor loss;  // of the last call
};

// The median time of `call` over `iterations`, then its peak from a state without a gradient,
// which the call then creates.
PathResult measure_path(const std::function<at::Tensor()>& call, at::Tensor& hidden,
                        int iterations) {
  PathResult out;
  const auto keep_loss = [&] { out.loss = call(); };
  out.ms = cuda_median_ms(keep_loss, 1, iterations);
  hidden.mutable_grad() = at::Tensor();
  out.peak_gib = peak_above_gib(keep_loss, hidden.numel() * 2);
  return out;
}

void print_path(const char* name, const PathResult& path, double gemm_ms) {
  std::printf("%-36s %10.2f %9.2f %10.3f %12.6g\n", name, path.ms, path.ms / gemm_ms, path.peak_gib,
              path.loss.item<double>());
}

// One more fused call under the kernel profiler; its wall time is the median measured before.
void profile_fused_call(const std::function<at::Tensor()>& fused, double wall_ms) {
  start_kernel_profile(true);
  fused();
  torch::cuda::synchronize();
  KernelProfile profile = stop_kernel_profile();
  profile.wall_ms = wall_ms;
  std::printf("\nfused vocabulary objective, one call profiled (wall: the median above)\n");
  print_kernel_profile(profile, stdout, 8);
}

void run(const Options& o) {
  const int64_t anchors = anchors_per_row(o);
  torch::manual_seed(0);
  VocabInputs in = make_inputs(o, anchors);
  const double tflops = bf16_gemm_tflops(o.rows, o.hidden, o.vocab);
  const double gemm_ms = 2.0 * o.rows * o.hidden * o.vocab / (tflops * 1e12) * 1e3;
  const int64_t chunk = ops::vocab_chunk_rows(o.vocab, 2, 2);
  const int64_t teacher_rows = ops::vocab_teacher_rows(in.teacher_index, in.states.size(0), chunk);

  ops::VocabObjectiveOptions fused_options;
  fused_options.ce_weight = o.ce_weight;
  fused_options.top_k = o.top_k;
  fused_options.use_kernel = true;
  const std::function<at::Tensor()> fused = [&] {
    return fused_loss(in, in.states, fused_options, in.teacher_index);
  };
  const PathResult by_position = measure_path(fused, in.hidden, o.iterations);
  const auto fused_grad = in.hidden.grad().clone();
  const PathResult per_row = measure_path(
      [&] { return fused_loss(in, in.teacher, fused_options, {}); }, in.hidden, o.iterations);
  const PathResult reference =
      measure_path([&] { return reference_chunks_loss(in, o); }, in.hidden, o.iterations);
  const double cosine = torch::cosine_similarity(fused_grad.flatten().to(torch::kFloat32),
                                                 in.hidden.grad().flatten().to(torch::kFloat32), 0)
                            .item<double>();

  std::printf(
      "\nDSpine backbone vocabulary terms, bf16, rows %ld, H %ld, V %ld, top-k %ld, "
      "ce_weight %.2f (forward + backward; peak GiB above inputs and dX)\n",
      long(o.rows), long(o.hidden), long(o.vocab), long(o.top_k), o.ce_weight);
  std::printf("one logits GEMM [%ld, %ld] x [%ld, %ld]: %.2f ms (%.0f TFLOP/s)\n", long(o.rows),
              long(o.hidden), long(o.hidden), long(o.vocab), gemm_ms, tflops);
  std::printf(
      "teacher states: %ld positions; the fused objective projects %ld teacher rows "
      "(chunks of %ld rows) for %ld proposal rows\n",
      long(in.states.size(0)), long(teacher_rows), long(chunk), long(o.rows));
  std::printf("%-36s %10s %9s %10s %12s\n", "path", "ms", "x GEMM", "peak GiB", "loss");
  print_path("fused, teacher by position", by_position, gemm_ms);
  print_path("fused, teacher gathered per row", per_row, gemm_ms);
  print_path("reference chunks (checkpointed)", reference, gemm_ms);
  std::printf("speedup %.2fx; hidden gradient cosine (fused vs reference) %.6f\n",
              reference.ms / by_position.ms, cosine);

  profile_fused_call(fused, by_position.ms);
}

}  // namespace

void register_vocab_bench(CLI::App& app) {
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "vocab",
      "DSpine backbone vocabulary terms (teacher, CE, L1, top-k, dX): fused vocabulary "
      "objective vs the reference chunks, forward + backward, against one logits GEMM");
  cmd->add_option("--rows", options->rows, "proposal rows (recipe: 15360)");
  cmd->add_option("--batch", options->batch, "sequences the proposal rows come from");
  cmd->add_option("--seq-len", options->seq_len, "target positions per sequence");
  cmd->add_option("--hidden", options->hidden, "hidden size H");
  cmd->add_option("--vocab", options->vocab, "vocabulary size V");
  cmd->add_option("--top-k", options->top_k, "candidates per row");
  cmd->add_option("--proposals", options->proposals, "rows per block of the reference chunks");
  cmd->add_option("--chunk-blocks", options->chunk_blocks, "blocks per reference chunk");
  cmd->add_option("--ce-weight", options->ce_weight, "CE weight of the backbone loss");
  cmd->add_option("--iters", options->iterations, "timed calls (the median is reported)");
  cmd->callback([options] {
    if (!torch::cuda::is_available()) fail("dspine-bench vocab: the benchmark needs a CUDA device");
    if (options->iterations < 1)
      fail("dspine-bench vocab: --iters must be >= 1, got {}", options->iterations);
    run(*options);
  });
}

}  // namespace dspine::bench
