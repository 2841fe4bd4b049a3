// `dspine-bench gspo`: the GSPO seam (reference vs fused) over N × S, and the monolithic vocab
// path (ATen pipeline vs chunked reference vs fused) over V; or, with --in/--out, one seam run on
// tensors from a safetensors file, written back for comparison with other implementations.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <CLI/CLI.hpp>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/torch.h>

#include "bench/bench.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "ops/gspo_seam.h"

namespace dspine::bench {
namespace {

using ops::GspoBackend;
using ops::GspoSeamParams;
using ops::GspoTokens;

struct Options {
  std::vector<int64_t> tokens{4096, 65536, 1 << 20};
  std::vector<int64_t> segments{16, 1024, 65536};
  std::vector<int64_t> vocab{32768, 151936};
  int64_t logit_rows = 16384;
  int iterations = 20;
  std::string in, out, backend = "auto";
};

// Median CUDA-event time of `fn` in ms, after two warm-up calls.
double time_ms(const std::function<void()>& fn, int iterations) {
  fn();
  fn();
  auto stream = at::cuda::getCurrentCUDAStream();
  std::vector<double> times;
  for (int i = 0; i < iterations; ++i) {
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    cudaEventRecord(start, stream);
    fn();
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    times.push_back(ms);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Captured {
  int64_t launches = -1;  // kernel + memset nodes per call; −1 if capture failed
  double replay_ms = -1;  // device time per call
};

// Captures `batch` back-to-back calls of `fn` into one CUDA graph (on a side stream), counts the
// launches one call issues, and times replays of that graph divided by `batch`: the device time
// of one call inside a captured step, without the host's launch latency (a single event pair
// around one replay of a three-node graph read ~15 µs, mostly graph launch overhead).
Captured capture(const std::function<void()>& fn, int iterations, int batch) {
  Captured result;
  auto side = at::cuda::getStreamFromPool();
  {
    c10::cuda::CUDAStreamGuard guard(side);
    fn();  // warm the allocator on this stream
    cudaStreamSynchronize(side);
  }
  try {
    at::cuda::CUDAGraph graph(/*keep_graph=*/true);
    {
      c10::cuda::CUDAStreamGuard guard(side);
      graph.capture_begin();
      for (int i = 0; i < batch; ++i) fn();
      graph.capture_end();
    }
    size_t nodes = 0;
    cudaGraphGetNodes(graph.raw_cuda_graph(), nullptr, &nodes);
    result.launches = static_cast<int64_t>(nodes) / batch;
    graph.instantiate();
    c10::cuda::CUDAStreamGuard guard(side);
    result.replay_ms = time_ms([&] { graph.replay(); }, iterations) / batch;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "note: graph capture failed: %.200s\n", e.what());
    cudaGetLastError();
  }
  return result;
}

struct SeamInputs {
  at::Tensor logprobs;
  GspoTokens tokens;
};

// Packed contiguous segments of equal length, 10% masked tokens, int64 ids and counts.
SeamInputs make_seam_inputs(int64_t n, int64_t s) {
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  auto segment = torch::div(torch::arange(n, cuda.dtype(torch::kInt64)) * s, n, "floor");
  auto masked = torch::rand({n}, cuda).lt(0.1);
  auto target = torch::where(masked, torch::full({}, -100, cuda.dtype(torch::kInt64)),
                             torch::randint(1000, {n}, cuda.dtype(torch::kInt64)));
  auto counts = torch::zeros({s}, cuda.dtype(torch::kInt64))
                    .index_add_(0, segment, masked.logical_not().to(torch::kInt64))
                    .index_select(0, segment);
  auto old = torch::randn({n}, cuda) * 0.5 - 2;
  return {old + torch::randn({n}, cuda) * 0.1,
          {target, old, torch::randn({n}, cuda), segment, counts}};
}

GspoSeamParams bench_params(int64_t s) {
  GspoSeamParams p;
  p.num_segments = s;
  p.divisor = static_cast<double>(s);
  p.grad_output = 1.0;
  p.logits_scale = 1.0;
  p.validate = false;  // value checks synchronise; the training loop validates once per batch
  return p;
}

void run_seam_table(const Options& o, double copy_gbs) {
  auto comm = dist::make_single_process_communicator();
  std::printf("\nGSPO seam (fp32, int64 ids/counts, g=1): eager = CUDA events around one call incl. "
              "host work; graph = device time per call, 20 calls captured in one graph; launches "
              "per call; fused = local form, span = reduce + all-reduce hook + finish\n");
  std::printf("%9s %7s | %10s %6s %10s | %10s %6s %10s %8s %7s | %10s %6s | %7s\n", "tokens",
              "segs", "ref eager", "launch", "ref graph", "fused eagr", "launch", "fused grph",
              "GB/s", "%copy", "span grph", "launch", "speedup");
  for (int64_t n : o.tokens) {
    for (int64_t s : o.segments) {
      if (s > n) continue;
      const SeamInputs in = make_seam_inputs(n, s);
      const auto p = bench_params(s);
      auto span_params = p;
      span_params.segments_span_ranks = true;
      auto ref = [&] { ops::gspo_segment_seam(in.logprobs, in.tokens, p, *comm, GspoBackend::kReference); };
      auto fused = [&] { ops::gspo_segment_seam(in.logprobs, in.tokens, p, *comm, GspoBackend::kFused); };
      auto span = [&] {
        ops::gspo_segment_seam(in.logprobs, in.tokens, span_params, *comm, GspoBackend::kFused);
      };
      const double ref_ms = time_ms(ref, o.iterations), fused_ms = time_ms(fused, o.iterations);
      const Captured ref_graph = capture(ref, o.iterations, 20);
      const Captured fused_graph = capture(fused, o.iterations, 20);
      const Captured span_graph = capture(span, o.iterations, 20);
      // Compulsory traffic: lp, target, old, adv, segment, count read (36 B/token), c written
      // (4 B/token); the [2, S] sums stay in L2. (The fused seam also writes and reads back a
      // 4-byte key per token.)
      const double bytes = 40.0 * n + 8.0 * s;
      const double best_ms = fused_graph.replay_ms > 0 ? fused_graph.replay_ms : fused_ms;
      const double gbs = bytes / (best_ms * 1e-3) / 1e9;
      std::printf("%9ld %7ld | %10.4f %6ld %10.4f | %10.4f %6ld %10.4f %8.0f %6.1f%% | %10.4f %6ld | %6.1fx\n",
                  long(n), long(s), ref_ms, long(ref_graph.launches), ref_graph.replay_ms, fused_ms,
                  long(fused_graph.launches), fused_graph.replay_ms, gbs, 100 * gbs / copy_gbs,
                  span_graph.replay_ms, long(span_graph.launches), ref_graph.replay_ms / best_ms);
    }
  }
}

// Peak device bytes allocated by fn beyond what was allocated before it (logits, inputs) and
// beyond the `grad_bytes` of the logits gradient it produces.
double extra_gib(const std::function<void()>& fn, int64_t grad_bytes) {
  torch::cuda::synchronize();
  const auto device = c10::cuda::current_device();
  c10::cuda::CUDACachingAllocator::resetPeakStats(device);
  const auto before = c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].current;
  fn();
  torch::cuda::synchronize();
  const auto peak = c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].peak;
  return double(peak - before - grad_bytes) / double(int64_t(1) << 30);
}

void run_monolithic_table(const Options& o, double copy_gbs) {
  auto comm = dist::make_single_process_communicator();
  const int64_t n = o.logit_rows, s = 1024;
  std::printf("\nGSPO monolithic (bf16 logits [%ld, V], λ=1, g=1, overwrite): time, launches, "
              "peak memory beyond logits and gradient\n", long(n));
  std::printf("%7s | %-22s %10s %8s %10s %8s %7s\n", "V", "path", "time ms", "launch", "extra GiB",
              "GB/s", "%copy");
  for (int64_t v : o.vocab) {
    SeamInputs in = make_seam_inputs(n, s);
    in.tokens.target = torch::where(in.tokens.target.ge(0), in.tokens.target % v, in.tokens.target);
    const auto logits = torch::randn({n, v}, torch::TensorOptions().device(torch::kCUDA)).to(torch::kBFloat16);
    const auto p = bench_params(s);
    const int64_t grad_bytes = logits.numel() * 2;
    at::Tensor grad = torch::empty_like(logits);

    // ATen pipeline: logits → log_softmax → gather → seam → autograd backward.
    auto leaf = logits.detach().requires_grad_(true);
    auto aten = [&] {
      leaf.mutable_grad() = at::Tensor();
      auto lp = (leaf.to(torch::kFloat32) * p.logits_scale)
                    .log_softmax(1)
                    .gather(1, in.tokens.target.clamp_min(0).unsqueeze(1))
                    .squeeze(1);
      auto seam = ops::gspo_segment_seam(lp.detach(), in.tokens, p, *comm, GspoBackend::kReference);
      torch::autograd::backward({lp}, {seam.coefficient / -p.logits_scale});
    };
    auto reference = [&] {
      ops::gspo_vocab_seam(logits, in.tokens, p, *comm, &grad, false, GspoBackend::kReference);
    };
    auto fused = [&] {
      ops::gspo_vocab_seam(logits, in.tokens, p, *comm, &grad, false, GspoBackend::kFused);
    };
    // The forward half alone (vocab forward + seam, no gradient): the backward is the rest.
    auto fused_forward = [&] {
      ops::gspo_vocab_seam(logits, in.tokens, p, *comm, nullptr, false, GspoBackend::kFused);
    };
    const int iterations = std::max(3, o.iterations / 4);
    // Compulsory traffic of the monolithic path: logits read twice, gradient written once
    // (the forward half: logits read once).
    const double bytes = 3.0 * double(grad_bytes);
    struct Row { const char* name; std::function<void()> fn; bool graph; int64_t grad; double bytes; };
    for (const Row& row : {Row{"aten log_softmax+autograd", aten, false, grad_bytes, bytes},
                           Row{"reference chunked", reference, false, 0, bytes},
                           Row{"fused monolithic", fused, true, 0, bytes},
                           Row{"fused forward only", fused_forward, true, 0, bytes / 3}}) {
      const double ms = time_ms(row.fn, iterations);
      const double gib = extra_gib(row.fn, row.grad);
      const Captured graph = row.graph ? capture(row.fn, iterations, 1) : Captured{};
      const double gbs = row.bytes / (ms * 1e-3) / 1e9;
      std::printf("%7ld | %-22s %10.3f %8ld %10.3f %8.0f %6.1f%%\n", long(v), row.name, ms,
                  long(graph.launches), gib, gbs, 100 * gbs / copy_gbs);
    }
  }
}

GspoBackend parse_backend(const std::string& name) {
  if (name == "reference") return GspoBackend::kReference;
  if (name == "fused") return GspoBackend::kFused;
  if (name == "auto") return GspoBackend::kAuto;
  fail("dspine-bench gspo: --backend must be auto, reference or fused, got '{}'", name);
}

double metadata_number(const core::SafetensorsFile& file, const std::string& key, double fallback) {
  const auto it = file.metadata.find(key);
  if (it == file.metadata.end()) return fallback;
  try {
    return std::stod(it->second);
  } catch (const std::exception&) {
    fail("{}: metadata '{}' = '{}' is not a number", file.path, key, it->second);
  }
}

// --in: tensors target, old_logprobs, advantages, segment, label_counts and either logprobs
// (seam) or logits (monolithic; optional grad_logits to accumulate into); metadata
// num_segments (required), logits_scale, eps_low, eps_high, divisor, grad_output,
// accumulate. --out: loss, new_logprobs, clipped_fraction, ratio_mean, segment_sums,
// coefficient, logprobs and (monolithic with grad_output) grad_logits.
void run_file(const Options& o) {
  const auto file = core::load_safetensors(o.in);
  const auto device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  auto get = [&](const char* name) { return file.at(name).to(device); };
  GspoSeamParams p;
  if (!file.metadata.count("num_segments")) fail("{}: metadata 'num_segments' is required", o.in);
  p.num_segments = static_cast<int64_t>(metadata_number(file, "num_segments", 0));
  p.logits_scale = metadata_number(file, "logits_scale", 1.0);
  p.eps_low = metadata_number(file, "eps_low", p.eps_low);
  p.eps_high = metadata_number(file, "eps_high", p.eps_high);
  p.divisor = metadata_number(file, "divisor", 1.0);
  if (file.metadata.count("grad_output")) p.grad_output = metadata_number(file, "grad_output", 1.0);
  const bool accumulate = metadata_number(file, "accumulate", 0.0) != 0.0;
  const GspoTokens tokens{get("target"), get("old_logprobs"), get("advantages"), get("segment"),
                          get("label_counts")};
  auto comm = dist::make_single_process_communicator();
  const GspoBackend backend = parse_backend(o.backend);
  core::NamedTensors out;
  ops::GspoSeamResult seam;
  if (file.contains("logits")) {
    const auto logits = get("logits");
    at::Tensor grad = file.contains("grad_logits") ? get("grad_logits") : torch::zeros_like(logits);
    const auto r = ops::gspo_vocab_seam(logits, tokens, p, *comm, &grad, accumulate, backend);
    seam = r.seam;
    out.emplace_back("logprobs", r.logprobs);
    if (p.grad_output) out.emplace_back("grad_logits", grad);
  } else {
    const auto lp = get("logprobs");
    seam = ops::gspo_segment_seam(lp, tokens, p, *comm, backend);
  }
  out.emplace_back("loss", seam.loss);
  out.emplace_back("new_logprobs", seam.new_logprobs);
  out.emplace_back("clipped_fraction", seam.clipped_fraction);
  out.emplace_back("ratio_mean", seam.ratio_mean);
  out.emplace_back("segment_sums", seam.segment_sums);
  if (seam.coefficient.defined()) out.emplace_back("coefficient", seam.coefficient);
  core::save_safetensors(o.out, out, {{"backend", o.backend}, {"device", device == torch::kCUDA ? "cuda" : "cpu"}});
  std::printf("gspo: loss %.9g new_logprobs %.9g clipped_fraction %.9g ratio_mean %.9g -> %s\n",
              seam.loss.item<double>(), seam.new_logprobs.item<double>(),
              seam.clipped_fraction.item<double>(), seam.ratio_mean.item<double>(), o.out.c_str());
}

void run(const Options& o) {
  if (!o.in.empty() || !o.out.empty()) {
    if (o.in.empty() || o.out.empty()) fail("dspine-bench gspo: --in and --out go together");
    run_file(o);
    return;
  }
  if (!torch::cuda::is_available()) fail("dspine-bench gspo: the benchmark needs a CUDA device");
  const double copy_gbs = measure_copy_bandwidth_gbs();
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, c10::cuda::current_device());
  std::printf("device: %s, copy bandwidth %.0f GB/s (read + write)\n", prop.name, copy_gbs);
  run_seam_table(o, copy_gbs);
  if (!o.vocab.empty()) run_monolithic_table(o, copy_gbs);
}

}  // namespace

void register_gspo_bench(CLI::App& app) {
  auto options = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("gspo", "GSPO seam: reference vs fused vs monolithic");
  sub->add_option("--tokens", options->tokens, "token counts N")->delimiter(',');
  sub->add_option("--segments", options->segments, "segment counts S")->delimiter(',');
  sub->add_option("--vocab", options->vocab, "vocab sizes V of the monolithic table")->delimiter(',');
  sub->add_option("--logit-rows", options->logit_rows, "rows N of the monolithic table");
  sub->add_option("--iterations", options->iterations, "timed calls per entry (median)");
  sub->add_option("--in", options->in, "safetensors inputs: run the seam once on them");
  sub->add_option("--out", options->out, "safetensors outputs of the --in run");
  sub->add_option("--backend", options->backend, "auto|reference|fused for --in");
  sub->callback([options] { run(*options); });
}

}  // namespace dspine::bench
