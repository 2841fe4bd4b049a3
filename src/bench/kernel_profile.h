// Per-kernel breakdown of a stretch of work (`dspine-bench step --profile`): LibTorch's Kineto
// profiler records it, and the CUDA kernels (plus memcpy/memset) are grouped by shortened name
// and into categories (GEMM, attention, elementwise, reductions, memcpy/memset, NCCL, other).
// A CPU run has no device activity: its report is the CPU operator table instead.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace dspine::bench {

// A kernel name without return type, namespaces, parameters and template arguments but the
// first named one, at most 80 characters ("void at::native::vectorized_elementwise_kernel<4,
// at::native::CUDAFunctor_add<c10::BFloat16>, ...>(...)" →
// "vectorized_elementwise_kernel[CUDAFunctor_add]").
std::string shorten_kernel_name(const std::string& name);

// "gemm", "attention", "nccl", "memcpy/memset", "reduction", "elementwise" or "other", from a
// kernel name; `memory` marks a memcpy or memset activity.
std::string kernel_category(const std::string& name, bool memory);

struct KernelRow {
  std::string name;  // shortened kernel name (or CPU operator name)
  std::string category;
  double total_ms = 0.0;
  int64_t calls = 0;
};

struct KernelProfile {
  std::string scope = "one window";  // what was profiled, for the report's first line
  bool device = false;            // CUDA activity was recorded (else `rows` are CPU operators)
  std::string unavailable;        // why nothing was recorded ("" when the profiler ran)
  std::vector<KernelRow> rows;    // grouped by name, longest total first
  double wall_ms = 0.0;           // the stretch's unprofiled wall time (set by the caller)
  double span_ms = 0.0;           // first device activity's start to the last one's end, in
                                  // the profiled stretch itself
  double kernel_ms() const;       // sum of the rows' totals
};

// Starts the Kineto profiler on this thread (CPU operators, plus CUDA kernels when `cuda`).
// A LibTorch without Kineto leaves it off; stop_kernel_profile then says so.
void start_kernel_profile(bool cuda);
// Stops it and groups what it recorded.
// `trace_path` non-empty: the Chrome trace (kernels linked to the operators that launched them)
// is also saved there.
KernelProfile stop_kernel_profile(const std::string& trace_path = "");

// Adds `part` (another stretch's profile) to `total`: rows of the same name sum, spans add up.
void merge_kernel_profile(KernelProfile& total, const KernelProfile& part);

// The report: categories with their share of the kernel time, the idle gap (wall − kernel time,
// split into the gaps between the profiled stretch's own kernels and the rest: the median wall's
// difference from the profiled stretch) and the `limit` longest kernels, as markdown tables
// (`limit` 0: every kernel).
void print_kernel_profile(const KernelProfile& profile, std::FILE* out, size_t limit);

}  // namespace dspine::bench
