// dspine-bench: kernel, seam and training-step benchmarks (run on the GPU machine; see
// scripts/bench_*.sh). `step` also runs under `mpirun -np N`.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "bench/bench.h"
#include "core/error.h"
#include "dist/mpi_context.h"

int main(int argc, char** argv) {
  CLI::App app{"dspine-bench: benchmarks of dspine's fused kernels against their references"};
  app.require_subcommand(1);
  dspine::bench::register_kernel_bench(app);
  dspine::bench::register_gspo_bench(app);
  dspine::bench::register_step_bench(app);
  dspine::bench::register_collective_bench(app);
  dspine::dist::MpiContext mpi(&argc, &argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    // dspine::Error carries its context; anything else (e.g. a torch check) is reported as is.
    const bool ours = dynamic_cast<const dspine::Error*>(&e) != nullptr;
    const char* kind = ours ? "error" : "internal error";
    if (mpi.world_size() == 1) {
      std::fprintf(stderr, "%s: %s\n", kind, e.what());
      return 1;
    }
    std::fprintf(stderr, "%s (rank %d): %s\n", kind, mpi.rank(), e.what());
    mpi.abort(1);  // a failing rank must not leave the others blocked in a collective
  }
  return 0;
}
