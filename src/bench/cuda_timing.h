// Timing helpers shared by the GPU benchmarks: CUDA-event medians and the device's bf16 GEMM rate
// measured in the same run (the yardstick for "fraction of the hardware limit").
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace dspine::bench {

// CUDA-event time of each of `iterations` calls of `fn` in ms, queued back to back on the current
// stream.
std::vector<double> cuda_each_ms(const std::function<void()>& fn, int iterations);

// Median CUDA-event time of `fn` in ms on the current stream after `warmup` untimed calls.
double cuda_median_ms(const std::function<void()>& fn, int warmup, int iterations);

// TFLOP/s of a [m, k] × [k, n] bf16 matmul on the current CUDA device (median of 20 calls).
double bf16_gemm_tflops(int64_t m = 16384, int64_t k = 4096, int64_t n = 12288);

}  // namespace dspine::bench
