// Benchmark suites behind apps/dspine-bench. Each suite registers its own CLI11 subcommand and
// prints one table: time (CUDA events, median after warm-up), bytes moved, GB/s and % of the
// device copy bandwidth measured in the same run.
#pragma once

namespace CLI {
class App;
}

namespace dspine::bench {

// Adds `kernels` (RMSNorm / SwiGLU: reference vs fused) to `app`.
void register_kernel_bench(CLI::App& app);
// Adds `gspo` (GSPO seam: reference vs fused vs monolithic) to `app`.
void register_gspo_bench(CLI::App& app);
// Adds `step` (time and peak memory of each phase of a training step: CE-only prepass, replay,
// optimizer) for any run configuration.
void register_step_bench(CLI::App& app);
// Adds `attention` (DSpine block attention of one layer: fused block kernels vs dense masked SDPA).
void register_attention_bench(CLI::App& app);
// Adds `vocab` (DSpine backbone vocabulary terms: fused vs reference chunks, recipe size).
void register_vocab_bench(CLI::App& app);
// Adds `gemm` (the recipe step's largest GEMMs: at::mm against each cuBLASLt algorithm offered).
void register_gemm_bench(CLI::App& app);
// Adds `collectives` (NCCL all-reduce / all-gather / reduce-scatter bus bandwidth through the
// NCCL communicator, under mpirun -np N) to `app`.
void register_collective_bench(CLI::App& app);

// Device-to-device copy bandwidth in GB/s (bytes read + written per second), measured with
// CUDA events on a buffer of `bytes` (median of repeated copies).
double measure_copy_bandwidth_gbs(size_t bytes = size_t(1) << 31);

}  // namespace dspine::bench
