// The device copy bandwidth every kernel benchmark reports its GB/s against.
#include <algorithm>
#include <vector>

#include <cuda_runtime_api.h>

#include "bench/bench.h"
#include "core/error.h"

namespace dspine::bench {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    fail("copy bandwidth: {} failed: {}", what, cudaGetErrorString(status));
}

}  // namespace

double measure_copy_bandwidth_gbs(size_t bytes) {
  constexpr int kWarmup = 3;
  constexpr int kRuns = 20;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    fail("copy bandwidth needs a CUDA device; none is visible");
  }
  void* src = nullptr;
  void* dst = nullptr;
  check(cudaMalloc(&src, bytes), "cudaMalloc (source)");
  check(cudaMalloc(&dst, bytes), "cudaMalloc (destination)");
  check(cudaMemset(src, 1, bytes), "cudaMemset");
  cudaStream_t stream;
  cudaEvent_t start, stop;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<float> times;
  for (int i = 0; i < kWarmup + kRuns; ++i) {
    cudaEventRecord(start, stream);
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
    cudaEventRecord(stop, stream);
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i >= kWarmup) times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  cudaFree(src);
  cudaFree(dst);
  std::sort(times.begin(), times.end());
  const double seconds = times[times.size() / 2] * 1e-3;
  return 2.0 * double(bytes) / seconds / 1e9;  // bytes read + bytes written
}

}  // namespace dspine::bench
