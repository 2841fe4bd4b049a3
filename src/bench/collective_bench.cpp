// `dspine-bench collectives` (under mpirun -np N, one GPU per rank): all-reduce, all-gather and
// reduce-scatter of one bf16 payload through our NCCL communicator, reported the nccl-tests
// way: algorithm bandwidth = size / time, bus bandwidth = algbw × 2(n−1)/n for all-reduce and
// × (n−1)/n for all-gather and reduce-scatter, where size is the full (gathered or scattered)
// tensor. Rank 0's CUDA-event time per call, averaged over --iters calls after a warm-up.
#include <cstdio>
#include <functional>
#include <memory>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <CLI/CLI.hpp>
#include <c10/cuda/CUDAStream.h>

#include "bench/bench.h"
#include "core/error.h"
#include "dist/launch.h"
#include "dist/mpi_context.h"
#include "dist/nccl_communicator.h"

namespace dspine::bench {
namespace {

struct Options {
  int64_t bytes = int64_t{1} << 30;
  int iters = 20;
  int warmup = 5;
  double timeout_s = 600;
};

struct Row {
  const char* name;
  double bus_factor;         // bus bandwidth / algorithm bandwidth for n ranks
  double reference_bus_gbs;  // torch.distributed's NCCL on nvidia-h200-x2 (given figures)
  std::function<void()> call;
};

double milliseconds_per_call(dist::Communicator& comm, const Options& options,
                             const std::function<void()>& call) {
  for (int i = 0; i < options.warmup; ++i) call();
  comm.barrier();
  at::cuda::CUDAEvent start(cudaEventDefault);
  at::cuda::CUDAEvent stop(cudaEventDefault);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  start.record(stream);
  for (int i = 0; i < options.iters; ++i) call();
  stop.record(stream);
  stop.synchronize();
  return start.elapsed_time(stop) / options.iters;
}

void run(const Options& options) {
  if (options.bytes <= 0 || options.iters <= 0 || options.warmup < 0)
    fail("collectives: --bytes and --iters must be > 0 and --warmup >= 0");
  const dist::RankLayout layout = dist::rank_layout();
  auto comm = dist::make_nccl_communicator(layout.local_rank, options.timeout_s);
  const int n = comm->world_size();
  // bf16 elements, a multiple of n so the payload splits into equal shards.
  const int64_t elements = options.bytes / 2 / n * n;
  if (elements == 0)
    fail("collectives: --bytes {} is smaller than {} bf16 elements", options.bytes, n);
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16).device(
      c10::kCUDA, static_cast<c10::DeviceIndex>(layout.local_rank));
  at::Tensor full = at::zeros({elements}, bf16);  // all-reduced, gathered into, scattered from
  at::Tensor shard = at::zeros({elements / n}, bf16);
  const double ring = n > 1 ? double(n - 1) / n : 0.0;
  const Row rows[] = {
      {"all_reduce", 2 * ring, 332, [&] { comm->all_reduce(full); }},
      {"all_gather", ring, 289, [&] { comm->all_gather(shard, full); }},
      {"reduce_scatter", ring, 283, [&] { comm->reduce_scatter(full, shard); }},
  };
  const double size_bytes = double(elements) * 2;
  if (comm->rank() == 0) {
    std::printf("NCCL collectives through dspine's communicator: %d ranks, %.3f GiB bf16, "
                "%d iterations after %d warm-up\n",
                n, size_bytes / double(int64_t{1} << 30), options.iters, options.warmup);
    std::printf("reference: torch NCCL on nvidia-h200-x2 (given figures, bus bandwidth)\n");
    std::printf("%-15s %10s %12s %12s %14s %8s\n", "collective", "time ms", "algbw GB/s",
                "busbw GB/s", "reference GB/s", "ratio");
  }
  for (const Row& row : rows) {
    const double ms = milliseconds_per_call(*comm, options, row.call);
    const double algbw = size_bytes / (ms * 1e-3) / 1e9;
    const double busbw = algbw * row.bus_factor;
    if (comm->rank() == 0) {
      std::printf("%-15s %10.3f %12.1f %12.1f %14.0f %7.2fx\n", row.name, ms, algbw, busbw,
                  row.reference_bus_gbs, busbw / row.reference_bus_gbs);
    }
  }
  comm->barrier();
}

}  // namespace

void register_collective_bench(CLI::App& app) {
  auto options = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "collectives", "NCCL all-reduce / all-gather / reduce-scatter bandwidth (under mpirun)");
  sub->add_option("--bytes", options->bytes, "payload in bytes (the full tensor)");
  sub->add_option("--iters", options->iters, "timed calls per collective");
  sub->add_option("--warmup", options->warmup, "untimed calls before timing");
  sub->add_option("--timeout", options->timeout_s,
                  "seconds before a stuck collective ends the job");
  sub->callback([options] { run(*options); });
}

}  // namespace dspine::bench
