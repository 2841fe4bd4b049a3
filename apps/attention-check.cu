// attention-check: the block attention kernels without torch, for kernel work on the GPU machine
// (docs/kernels.md, "Block attention"). Runs the wgmma descriptor probe, both instruction sets
// against an fp64 host reference on a small shape, both against each other at the recipe's shape,
// and their forward and backward times there. Built with the project (target attention-check), or
// alone in seconds (nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -DDSPINE_HAS_SM90A
// --expt-relaxed-constexpr -Isrc, on src/kernels/block_attention.cu, src/kernels/wgmma_probe.cu
// and this file), so that a kernel change can be built here and carried to the GPU machine.
// The tests (tests/gpu/test_block_attention_gpu.cpp) remain the gate; this is the quick loop.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/block_attention.h"
#include "kernels/wgmma_probe.h"

namespace {

using bf16 = __nv_bfloat16;
using dspine::kernels::AttentionInstructions;
using dspine::kernels::BlockAttentionShape;

constexpr int64_t kHeadDim = 128;  // the only head dimension the wgmma kernels take
constexpr int kWarmups = 2;
constexpr int kIterations = 10;

// A CUDA call failed: the run cannot go on, and main reports it as a failed check.
class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void check_cuda(cudaError_t error, const char* call, int line) {
  if (error != cudaSuccess) {
    throw CudaError(std::string("CUDA error ") + cudaGetErrorString(error) + " in " + call +
                    " at line " + std::to_string(line));
  }
}

#define CUDA_CHECK(call) check_cuda((call), #call, __LINE__)

// Device memory of `size` elements of T, freed when it goes out of scope (also when a CUDA error
// unwinds a section).
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t size) : size_(size) {
    CUDA_CHECK(cudaMalloc(&data_, size_ * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    CUDA_CHECK(cudaMemcpy(data_, host.data(), size_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return data_; }
  size_t size() const { return size_; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

float to_float(bf16 x) { return __bfloat162float(x); }
float to_float(float x) { return x; }

// The buffer's contents as floats, for compare.
template <typename T>
std::vector<float> download(const DeviceBuffer<T>& buffer) {
  std::vector<T> host(buffer.size());
  CUDA_CHECK(
      cudaMemcpy(host.data(), buffer.get(), host.size() * sizeof(T), cudaMemcpyDeviceToHost));
  std::vector<float> values(host.size());
  for (size_t i = 0; i < host.size(); ++i) values[i] = to_float(host[i]);
  return values;
}

std::vector<bf16> random_normal(size_t n, std::mt19937& gen, float stddev = 1.f) {
  std::normal_distribution<float> normal(0.f, stddev);
  std::vector<bf16> values(n);
  for (auto& x : values) x = __float2bfloat16(normal(gen));
  return values;
}

struct Tolerance {
  double max_relative_error;
  double min_cosine;
};
// The probe's fp32 products against fp64 ones from the same bf16 inputs: accumulation order only.
constexpr Tolerance kProbeTolerance{1e-5, -std::numeric_limits<double>::infinity()};
// bf16 outputs, against the fp64 reference or against the other instruction set.
constexpr Tolerance kBf16Tolerance{1e-2, 0.9999};

// Compares `actual` with `expected`: the relative L2 error and the cosine over the elements finite
// in both, and the finite mismatches (elements finite in only one of them, such as an element a
// kernel left unwritten). Prints one line, marked FAIL when a bound is missed or any element
// mismatches, and returns whether the comparison passed.
bool compare(const char* what, const std::vector<float>& actual, const std::vector<float>& expected,
             const Tolerance& tolerance) {
  double error_sq = 0, actual_sq = 0, expected_sq = 0, dot = 0;
  size_t finite_mismatch = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const bool actual_finite = std::isfinite(actual[i]);
    const bool expected_finite = std::isfinite(expected[i]);
    if (!actual_finite || !expected_finite) {
      if (actual_finite != expected_finite) ++finite_mismatch;
      continue;
    }
    const double error = actual[i] - expected[i];
    error_sq += error * error;
    actual_sq += double(actual[i]) * actual[i];
    expected_sq += double(expected[i]) * expected[i];
    dot += double(actual[i]) * expected[i];
  }
  const double relative_error = std::sqrt(error_sq / std::max(expected_sq, 1e-30));
  const double cosine = dot / std::sqrt(std::max(actual_sq * expected_sq, 1e-300));
  const bool passed = relative_error <= tolerance.max_relative_error &&
                      cosine >= tolerance.min_cosine && finite_mismatch == 0;
  std::printf("%-28s rel %.3e cosine %.8f finite-mismatch %zu%s\n", what, relative_error, cosine,
              finite_mismatch, passed ? "" : " FAIL");
  return passed;
}

// Milliseconds of repeated launches on the default stream, between two events.
class Timer {
 public:
  Timer() {
    CUDA_CHECK(cudaEventCreate(&start_));
    CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~Timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // Total time of `iterations` calls of `launch` (which returns a cudaError_t).
  template <typename Launch>
  float total_ms(int iterations, const Launch& launch) {
    CUDA_CHECK(cudaEventRecord(start_));
    for (int i = 0; i < iterations; ++i) CUDA_CHECK(launch());
    CUDA_CHECK(cudaEventRecord(stop_));
    CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// The wgmma descriptor probe: S = Q Kᵀ and O = P V for one tile (kernels/wgmma_probe.h).

constexpr int kProbeRows = 64;
constexpr int kProbeKeys = 64;

struct ProbeInputs {
  std::vector<bf16> q, k, p, v;  // q, k, v [64, 128]; p [64, 64]
};

ProbeInputs random_probe_inputs(std::mt19937& gen) {
  ProbeInputs in;
  // One statement each: the draws from `gen` stay in this order.
  in.q = random_normal(kProbeRows * kHeadDim, gen);
  in.k = random_normal(kProbeKeys * kHeadDim, gen);
  in.p = random_normal(kProbeRows * kProbeKeys, gen, 0.3f);
  in.v = random_normal(kProbeKeys * kHeadDim, gen);
  return in;
}

// Runs the probe and compares its products with fp64 ones; returns the number of failed checks.
int check_probe(const ProbeInputs& in) {
  auto f = [](bf16 x) { return double(__bfloat162float(x)); };
  std::vector<float> s_expected(kProbeRows * kProbeKeys);
  std::vector<float> o_expected(kProbeRows * kHeadDim);
  for (int i = 0; i < kProbeRows; ++i) {
    for (int j = 0; j < kProbeKeys; ++j) {
      double s = 0;
      for (int d = 0; d < kHeadDim; ++d) s += f(in.q[i * kHeadDim + d]) * f(in.k[j * kHeadDim + d]);
      s_expected[i * kProbeKeys + j] = s;
    }
  }
  for (int i = 0; i < kProbeRows; ++i) {
    for (int d = 0; d < kHeadDim; ++d) {
      double o = 0;
      for (int j = 0; j < kProbeKeys; ++j) {
        o += f(in.p[i * kProbeKeys + j]) * f(in.v[j * kHeadDim + d]);
      }
      o_expected[i * kHeadDim + d] = o;
    }
  }

  const DeviceBuffer<bf16> q(in.q), k(in.k), p(in.p), v(in.v);
  DeviceBuffer<float> s(s_expected.size()), o(o_expected.size());
  // NaN everywhere, so that an element the probe leaves unwritten shows as a finite mismatch.
  CUDA_CHECK(cudaMemset(s.get(), 0xff, s.size() * sizeof(float)));
  CUDA_CHECK(cudaMemset(o.get(), 0xff, o.size() * sizeof(float)));
  CUDA_CHECK(dspine::kernels::wgmma_probe(q.get(), k.get(), p.get(), v.get(), s.get(), o.get(), 0));
  CUDA_CHECK(cudaDeviceSynchronize());

  std::printf("probe:\n");
  int failures = 0;
  failures += !compare("  S = Q K^T", download(s), s_expected, kProbeTolerance);
  failures += !compare("  O = P V", download(o), o_expected, kProbeTolerance);
  return failures;
}

// ---------------------------------------------------------------------------------------------
// Block attention: the problem, its fp64 reference and the kernels' runs.

struct HostProblem {
  BlockAttentionShape shape;
  std::vector<bf16> q, k, v, dout;
  std::vector<int64_t> anchors;
  std::vector<uint8_t> keep;

  int64_t queries() const { return shape.blocks * shape.block_size; }
  int64_t keys() const { return shape.context + queries(); }
  size_t query_elements() const { return shape.rows * queries() * shape.heads * shape.head_dim; }
  size_t key_elements() const { return shape.rows * keys() * shape.kv_heads * shape.head_dim; }
  size_t stat_elements() const { return shape.rows * queries() * shape.heads; }  // lse, delta
};

// q, k, v and dout from `gen`, in that order; anchors and keep are left to the caller.
HostProblem random_problem(const BlockAttentionShape& shape, std::mt19937& gen) {
  HostProblem problem;
  problem.shape = shape;
  problem.q = random_normal(problem.query_elements(), gen);
  problem.k = random_normal(problem.key_elements(), gen);
  problem.v = random_normal(problem.key_elements(), gen);
  problem.dout = random_normal(problem.query_elements(), gen);
  return problem;
}

struct HostResult {
  std::vector<float> out, dq, dk, dv;
};

// The fp64 block attention and its gradients on the host (docs/kernels.md's mask), for a small
// shape: query j of block n sees the context keys before its anchor and its block's keys 0..j.
HostResult reference_attention(const HostProblem& problem, float scale) {
  const BlockAttentionShape& shape = problem.shape;
  const int64_t queries = problem.queries(), keys = problem.keys();
  const int64_t heads = shape.heads, kv_heads = shape.kv_heads, dim = shape.head_dim;
  const std::vector<bf16>& q = problem.q;
  const std::vector<bf16>& k = problem.k;
  const std::vector<bf16>& v = problem.v;
  auto f = [](bf16 x) { return double(__bfloat162float(x)); };
  auto query_at = [&](int64_t b, int64_t i, int64_t h) {
    return ((b * queries + i) * heads + h) * dim;
  };
  auto key_at = [&](int64_t b, int64_t key, int64_t g) {
    return ((b * keys + key) * kv_heads + g) * dim;
  };

  HostResult result{std::vector<float>(q.size()), std::vector<float>(q.size()),
                    std::vector<float>(k.size()), std::vector<float>(k.size())};
  // dk and dv collect over many queries: fp64 until the end.
  std::vector<double> dk(k.size()), dv(k.size());
  for (int64_t b = 0; b < shape.rows; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < queries; ++i) {
        const int64_t n = i / shape.block_size, j = i % shape.block_size;
        const int64_t g = h / (heads / kv_heads);
        if (!problem.keep[b * shape.blocks + n]) continue;  // dropped: zeros
        std::vector<int64_t> visible;
        for (int64_t c = 0; c < problem.anchors[b * shape.blocks + n]; ++c) visible.push_back(c);
        for (int64_t jj = 0; jj <= j; ++jj) {
          visible.push_back(shape.context + n * shape.block_size + jj);
        }
        const bf16* qi = &q[query_at(b, i, h)];
        const bf16* doi = &problem.dout[query_at(b, i, h)];

        // Forward: p = softmax(scale · q kᵀ) over the visible keys, o = p v.
        std::vector<double> p(visible.size());
        double max_score = -1e300;
        for (size_t t = 0; t < visible.size(); ++t) {
          const bf16* kt = &k[key_at(b, visible[t], g)];
          double dot = 0;
          for (int64_t d = 0; d < dim; ++d) dot += f(qi[d]) * f(kt[d]);
          p[t] = dot * scale;
          max_score = std::max(max_score, p[t]);
        }
        double sum = 0;
        for (auto& x : p) {
          x = std::exp(x - max_score);
          sum += x;
        }
        for (auto& x : p) x /= sum;
        std::vector<double> o(dim, 0.0);
        for (size_t t = 0; t < visible.size(); ++t) {
          const bf16* vt = &v[key_at(b, visible[t], g)];
          for (int64_t d = 0; d < dim; ++d) o[d] += p[t] * f(vt[d]);
        }

        // Backward: ds = p ∘ (dout vᵀ − delta) with delta = dout · o.
        double delta = 0;
        for (int64_t d = 0; d < dim; ++d) delta += o[d] * f(doi[d]);
        std::vector<double> dq(dim, 0.0);
        for (size_t t = 0; t < visible.size(); ++t) {
          const int64_t at = key_at(b, visible[t], g);
          double dp = 0;
          for (int64_t d = 0; d < dim; ++d) dp += f(doi[d]) * f(v[at + d]);
          const double ds = p[t] * (dp - delta);
          for (int64_t d = 0; d < dim; ++d) {
            dq[d] += scale * ds * f(k[at + d]);
            dk[at + d] += scale * ds * f(qi[d]);
            dv[at + d] += p[t] * f(doi[d]);
          }
        }
        for (int64_t d = 0; d < dim; ++d) {
          result.out[query_at(b, i, h) + d] = o[d];
          result.dq[query_at(b, i, h) + d] = dq[d];
        }
      }
    }
  }
  for (size_t x = 0; x < dk.size(); ++x) {
    result.dk[x] = dk[x];
    result.dv[x] = dv[x];
  }
  return result;
}

// The problem's inputs on the device.
struct DeviceProblem {
  explicit DeviceProblem(const HostProblem& host)
      : shape(host.shape),
        q(host.q),
        k(host.k),
        v(host.v),
        dout(host.dout),
        anchors(host.anchors),
        keep(host.keep) {}

  BlockAttentionShape shape;
  DeviceBuffer<bf16> q, k, v, dout;
  DeviceBuffer<int64_t> anchors;
  DeviceBuffer<uint8_t> keep;
};

// One instruction set's forward outputs and gradients.
struct DeviceResult {
  explicit DeviceResult(const HostProblem& host)
      : out(host.query_elements()),
        dq(host.query_elements()),
        dk(host.key_elements()),
        dv(host.key_elements()),
        lse(host.stat_elements()) {}

  DeviceBuffer<bf16> out, dq, dk, dv;
  DeviceBuffer<float> lse;
};

cudaError_t forward(const DeviceProblem& problem, float scale, DeviceResult& result,
                    AttentionInstructions instructions) {
  return dspine::kernels::block_attention_forward(
      problem.shape, problem.q.get(), problem.k.get(), problem.v.get(), problem.anchors.get(),
      problem.keep.get(), scale, result.out.get(), result.lse.get(), 0, instructions);
}

// The gradients into `result`, from the out and lse of `forwarded` (possibly another run's).
cudaError_t backward(const DeviceProblem& problem, float scale, const DeviceResult& forwarded,
                     DeviceBuffer<float>& delta, DeviceResult& result,
                     AttentionInstructions instructions) {
  return dspine::kernels::block_attention_backward(
      problem.shape, problem.q.get(), problem.k.get(), problem.v.get(), forwarded.out.get(),
      problem.dout.get(), forwarded.lse.get(), problem.anchors.get(), problem.keep.get(), scale,
      delta.get(), result.dq.get(), result.dk.get(), result.dv.get(), 0, instructions);
}

struct InstructionSet {
  const char* name;
  AttentionInstructions instructions;
};
// kAutomatic is wgmma where wgmma_available(), else mma.sync.
constexpr InstructionSet kInstructionSets[2] = {{"wgmma", AttentionInstructions::kAutomatic},
                                                {"mma.sync", AttentionInstructions::kMmaSync}};

// Both instruction sets against the fp64 reference on a small shape with unsorted anchors, an
// anchor at 0, a partial context tile, dropped blocks and rows past the group (bs 12 × 4 heads:
// 48 of a tile's 64 rows). Returns the number of failed checks.
int check_against_reference(std::mt19937& gen) {
  // rows, context, blocks, block size, heads, kv heads, head dim
  HostProblem host = random_problem({2, 200, 9, 12, 8, 2, kHeadDim}, gen);
  host.anchors = {0, 150, 7, 199, 64, 128, 1, 90, 33, 5, 180, 2, 63, 65, 127, 0, 100, 199};
  host.keep.assign(host.shape.rows * host.shape.blocks, 1);
  host.keep[3] = 0;
  host.keep[12] = 0;
  const float scale = 1.f / std::sqrt(float(kHeadDim));
  const HostResult expected = reference_attention(host, scale);

  const DeviceProblem problem(host);
  DeviceResult result(host);
  DeviceBuffer<float> delta(host.stat_elements());
  int failures = 0;
  for (const InstructionSet& set : kInstructionSets) {
    CUDA_CHECK(forward(problem, scale, result, set.instructions));
    CUDA_CHECK(backward(problem, scale, result, delta, result, set.instructions));
    CUDA_CHECK(cudaDeviceSynchronize());
    std::printf("%s against the fp64 reference:\n", set.name);
    failures += !compare("  out", download(result.out), expected.out, kBf16Tolerance);
    failures += !compare("  dq", download(result.dq), expected.dq, kBf16Tolerance);
    failures += !compare("  dk", download(result.dk), expected.dk, kBf16Tolerance);
    failures += !compare("  dv", download(result.dv), expected.dv, kBf16Tolerance);
  }
  return failures;
}

// The instruction sets against each other at the recipe's shape, then their forward and backward
// times there. Returns the number of failed checks.
int check_recipe_shape(std::mt19937& gen) {
  // rows, context, blocks, block size, heads, kv heads, head dim
  HostProblem host = random_problem({2, 3072, 512, 16, 32, 8, kHeadDim}, gen);
  const BlockAttentionShape& shape = host.shape;
  // Each row's anchors: distinct, sorted, drawn from 0..context-2.
  for (int64_t b = 0; b < shape.rows; ++b) {
    std::vector<int64_t> positions(shape.context - 1);
    for (size_t i = 0; i < positions.size(); ++i) positions[i] = i;
    std::shuffle(positions.begin(), positions.end(), gen);
    positions.resize(shape.blocks);
    std::sort(positions.begin(), positions.end());
    host.anchors.insert(host.anchors.end(), positions.begin(), positions.end());
  }
  host.anchors[0] = 0;  // a block that sees no context
  host.keep.assign(shape.rows * shape.blocks, 1);
  host.keep[shape.blocks / 2] = 0;
  const float scale = 1.f / std::sqrt(float(kHeadDim));

  const DeviceProblem problem(host);
  DeviceResult results[2] = {DeviceResult(host), DeviceResult(host)};
  DeviceResult& wgmma = results[0];
  DeviceResult& mma_sync = results[1];
  DeviceBuffer<float> delta(host.stat_elements());
  int failures = 0;

  for (int i = 0; i < 2; ++i) {
    CUDA_CHECK(forward(problem, scale, results[i], kInstructionSets[i].instructions));
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  failures += !compare("forward out wgmma vs mma", download(wgmma.out), download(mma_sync.out),
                       kBf16Tolerance);
  failures += !compare("forward lse wgmma vs mma", download(wgmma.lse), download(mma_sync.lse),
                       kBf16Tolerance);

  // Both backwards from the mma.sync forward, so that they differ only in their own kernels.
  for (int i = 0; i < 2; ++i) {
    CUDA_CHECK(
        backward(problem, scale, mma_sync, delta, results[i], kInstructionSets[i].instructions));
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  failures +=
      !compare("dq wgmma vs mma", download(wgmma.dq), download(mma_sync.dq), kBf16Tolerance);
  failures +=
      !compare("dk wgmma vs mma", download(wgmma.dk), download(mma_sync.dk), kBf16Tolerance);
  failures +=
      !compare("dv wgmma vs mma", download(wgmma.dv), download(mma_sync.dv), kBf16Tolerance);

  Timer timer;
  for (int i = 0; i < 2; ++i) {
    const AttentionInstructions instructions = kInstructionSets[i].instructions;
    auto run_forward = [&] { return forward(problem, scale, results[i], instructions); };
    auto run_backward = [&] {
      return backward(problem, scale, mma_sync, delta, results[i], instructions);
    };
    for (int w = 0; w < kWarmups; ++w) CUDA_CHECK(run_forward());
    const float forward_ms = timer.total_ms(kIterations, run_forward);
    const float backward_ms = timer.total_ms(kIterations, run_backward);
    std::printf("%s: forward %.3f ms, backward %.3f ms, total %.3f ms\n", kInstructionSets[i].name,
                forward_ms / kIterations, backward_ms / kIterations,
                (forward_ms + backward_ms) / kIterations);
  }
  CUDA_CHECK(cudaGetLastError());
  return failures;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("attention-check: no CUDA device\n");
    return 0;
  }

  std::mt19937 gen(1);
  const bool wgmma = dspine::kernels::wgmma_available();
  std::printf("wgmma available: %d\n", int(wgmma));
  int failures = 0;
  try {
    // Drawn even when the probe is skipped, so that the later sections get the same inputs.
    const ProbeInputs probe_inputs = random_probe_inputs(gen);
    if (wgmma) {
      failures += check_probe(probe_inputs);
    } else {
      std::printf("probe: skipped, no wgmma here (the \"wgmma\" runs below take mma.sync)\n");
    }
    failures += check_against_reference(gen);
    failures += check_recipe_shape(gen);
  } catch (const CudaError& error) {
    // Sticky errors would fail every later call: stop here.
    std::printf("%s FAIL\n", error.what());
    ++failures;
  }

  if (failures > 0) {
    std::printf("attention-check: %d checks failed\n", failures);
    return 1;
  }
  std::printf("attention-check: all checks passed\n");
  return 0;
}
