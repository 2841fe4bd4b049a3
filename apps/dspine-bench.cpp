// dspine-bench: kernel, seam and training-step benchmarks (run on the GPU machine; see
// scripts/bench_*.sh). `step` also runs under `mpirun -np N`.
#include <exception>

#include <CLI/CLI.hpp>

#include "bench/bench.h"
#include "cli_usage.h"
#include "dist/mpi_context.h"

int main(int argc, char** argv) {
  CLI::App app{"dspine-bench: benchmarks of dspine's fused kernels against their references"};
  app.require_subcommand(1);
  dspine::bench::register_kernel_bench(app);
  dspine::bench::register_gspo_bench(app);
  dspine::bench::register_step_bench(app);
  dspine::bench::register_collective_bench(app);
  dspine::bench::register_attention_bench(app);
  dspine::bench::register_vocab_bench(app);
  dspine::bench::register_gemm_bench(app);
  dspine::dist::MpiContext mpi(&argc, &argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return dspine::cli::exit_on_usage_error(app, e);
  } catch (const std::exception& e) {
    return mpi.fail_run(e);
  }
  return 0;
}
