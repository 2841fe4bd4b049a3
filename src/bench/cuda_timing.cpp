#include "bench/cuda_timing.h"

#include <algorithm>
#include <vector>

#include <ATen/cuda/CUDAContext.h>
#include <torch/torch.h>

namespace dspine::bench {

std::vector<double> cuda_each_ms(const std::function<void()>& fn, int iterations) {
  const auto stream = at::cuda::getCurrentCUDAStream();
  std::vector<cudaEvent_t> events(2 * iterations);
  for (auto& e : events) cudaEventCreate(&e);
  for (int i = 0; i < iterations; ++i) {
    cudaEventRecord(events[2 * i], stream);
    fn();
    cudaEventRecord(events[2 * i + 1], stream);
  }
  cudaEventSynchronize(events.back());
  std::vector<double> times(iterations);
  for (int i = 0; i < iterations; ++i) {
    float ms = 0;
    cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]);
    times[i] = ms;
  }
  for (auto& e : events) cudaEventDestroy(e);
  return times;
}

double cuda_median_ms(const std::function<void()>& fn, int warmup, int iterations) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> times = cuda_each_ms(fn, iterations);
  std::sort(times.begin(), times.end());
  return times[iterations / 2];
}

double bf16_gemm_tflops(int64_t m, int64_t k, int64_t n) {
  auto options = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  auto a = torch::randn({m, k}, options), b = torch::randn({k, n}, options);
  auto c = torch::empty({m, n}, options);
  const double ms = cuda_median_ms([&] { at::matmul_out(c, a, b); }, 5, 20);
  return 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n) /
         (ms * 1e-3) / 1e12;
}

}  // namespace dspine::bench
