// dspine-bench: kernel and seam benchmarks (run on the GPU machine; see scripts/bench_*.sh).
#include <cstdio>

#include <CLI/CLI.hpp>

#include "bench/bench.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"dspine-bench: benchmarks of dspine's fused kernels against their references"};
  app.require_subcommand(1);
  dspine::bench::register_kernel_bench(app);
  dspine::bench::register_gspo_bench(app);
  dspine::bench::register_step_bench(app);
  dspine::bench::register_collective_bench(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const dspine::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
