#include "bench/kernel_profile.h"

#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cctype>
#include <exception>
#include <map>
#include <set>

namespace dspine::bench {

namespace {

namespace profiler = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

constexpr size_t kMaxName = 80;

std::string last_component(std::string name) {
  const auto colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

// The first template argument of `args` (the text after '<') that is a name, not a number or a
// boolean: the functor of an elementwise kernel, the configuration of a cutlass kernel.
std::string first_named_argument(const std::string& args) {
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= args.size(); ++i) {
    const char c = i < args.size() ? args[i] : '>';
    if (depth > 0 || (c != ',' && c != '>')) {
      if (c == '<' || c == '(') ++depth;
      if ((c == '>' || c == ')') && depth > 0) --depth;
    } else {
      auto arg = args.substr(start, i - start);
      arg.erase(0, arg.find_first_not_of(' '));
      arg = arg.substr(0, arg.find('<'));
      if (!arg.empty() && !std::isdigit(static_cast<unsigned char>(arg[0])) && arg != "true" &&
          arg != "false") {
        return last_component(arg);
      }
      if (c == '>') break;
      start = i + 1;
    }
  }
  return "";
}

bool contains_any(const std::string& text, std::initializer_list<const char*> words) {
  return std::any_of(words.begin(), words.end(),
                     [&](const char* word) { return text.find(word) != std::string::npos; });
}

}  // namespace

std::string shorten_kernel_name(const std::string& name) {
  std::string text = name;
  for (const std::string noise : {"(anonymous namespace)::", "void "}) {
    for (auto at = text.find(noise); at != std::string::npos; at = text.find(noise)) {
      text.erase(at, noise.size());
    }
  }
  const auto open = text.find_first_of("<(");
  std::string shortened = last_component(text.substr(0, open));
  if (open != std::string::npos && text[open] == '<') {
    const auto argument = first_named_argument(text.substr(open + 1));
    if (!argument.empty()) shortened += "[" + argument + "]";
  }
  if (shortened.empty()) shortened = name;
  return shortened.size() > kMaxName ? shortened.substr(0, kMaxName) : shortened;
}

std::string kernel_category(const std::string& name, bool memory) {
  if (memory) return "memcpy/memset";
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (contains_any(lower, {"nccl"})) return "nccl";
  // Before GEMM: memory-efficient attention kernels are cutlass kernels too.
  if (contains_any(lower, {"flash", "fmha", "attention", "attn", "sdpa"})) return "attention";
  if (contains_any(lower, {"gemm", "cutlass", "xmma", "cublas", "nvjet", "splitk", "sm90_"})) {
    return "gemm";
  }
  if (contains_any(lower, {"reduce", "softmax", "norm", "topk", "sort", "scan", "argmax",
                           "cross_entropy", "radix", "sum"})) {
    return "reduction";
  }
  if (contains_any(lower, {"elementwise", "vectorized", "unrolled", "copy", "fill", "index",
                           "gather", "scatter", "cat", "where", "embedding", "swiglu", "rope"})) {
    return "elementwise";
  }
  return "other";
}

double KernelProfile::kernel_ms() const {
  double total = 0.0;
  for (const auto& row : rows) total += row.total_ms;
  return total;
}

void start_kernel_profile(bool cuda) {
  // Input shapes in the trace: scripts/profile_by_op.py --gemms rates each product by them.
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO, /*report_input_shapes=*/true);
  std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
  if (cuda) activities.insert(impl::ActivityType::CUDA);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
}

KernelProfile stop_kernel_profile(const std::string& trace_path) {
  KernelProfile profile;
  std::unique_ptr<profiler::ProfilerResult> result;
  try {
    result = profiler::disableProfiler();
  } catch (const std::exception& e) {
    profile.unavailable = e.what();
    return profile;
  }
  if (!result) {
    profile.unavailable = "the profiler recorded nothing";
    return profile;
  }
  if (!trace_path.empty()) result->save(trace_path);
  std::map<std::string, KernelRow> device, host;
  uint64_t first_start = UINT64_MAX, last_end = 0;
  for (const auto& event : result->events()) {
    const auto type = static_cast<libkineto::ActivityType>(event.activityType());
    const bool memory = type == libkineto::ActivityType::GPU_MEMCPY ||
                        type == libkineto::ActivityType::GPU_MEMSET;
    const bool kernel = type == libkineto::ActivityType::CONCURRENT_KERNEL;
    if (!kernel && !memory && type != libkineto::ActivityType::CPU_OP) continue;
    const bool on_device = kernel || memory;
    // Categories from the shortened name: long template arguments would match anything.
    const auto name =
        on_device ? shorten_kernel_name(event.name()) : event.name().substr(0, kMaxName);
    auto& row = on_device ? device[name] : host[name];
    row.name = name;
    row.category = on_device ? kernel_category(name, memory) : "cpu_op";
    row.total_ms += static_cast<double>(event.durationNs()) * 1e-6;
    ++row.calls;
    if (on_device) {
      first_start = std::min<uint64_t>(first_start, event.startNs());
      last_end = std::max<uint64_t>(last_end, event.startNs() + event.durationNs());
    }
  }
  profile.device = !device.empty();
  if (profile.device) profile.span_ms = static_cast<double>(last_end - first_start) * 1e-6;
  for (const auto& [name, row] : profile.device ? device : host) profile.rows.push_back(row);
  std::sort(profile.rows.begin(), profile.rows.end(),
            [](const KernelRow& a, const KernelRow& b) { return a.total_ms > b.total_ms; });
  return profile;
}

void merge_kernel_profile(KernelProfile& total, const KernelProfile& part) {
  if (total.unavailable.empty()) total.unavailable = part.unavailable;
  total.device = total.device || part.device;
  total.span_ms += part.span_ms;
  for (const auto& row : part.rows) {
    const auto same = std::find_if(total.rows.begin(), total.rows.end(),
                                   [&](const KernelRow& r) { return r.name == row.name; });
    if (same == total.rows.end()) {
      total.rows.push_back(row);
    } else {
      same->total_ms += row.total_ms;
      same->calls += row.calls;
    }
  }
  std::sort(total.rows.begin(), total.rows.end(),
            [](const KernelRow& a, const KernelRow& b) { return a.total_ms > b.total_ms; });
}

void print_kernel_profile(const KernelProfile& profile, std::FILE* out, size_t limit) {
  if (!profile.unavailable.empty()) {
    std::fprintf(out, "profile: unavailable (%s)\n", profile.unavailable.c_str());
    return;
  }
  const size_t shown = limit == 0 ? profile.rows.size() : std::min(limit, profile.rows.size());
  if (!profile.device) {
    // CPU operators nest (an op's time includes the ops it calls): no shares, no idle gap.
    std::fprintf(out,
                 "profile: no CUDA activity recorded (a CPU run, or no CUPTI); CPU "
                 "operators, inclusive times, %s\n\n",
                 profile.scope.c_str());
    std::fprintf(out, "| operator | total ms | calls |\n|---|---:|---:|\n");
    for (size_t i = 0; i < shown; ++i) {
      const auto& row = profile.rows[i];
      std::fprintf(out, "| %s | %.3f | %lld |\n", row.name.c_str(), row.total_ms,
                   static_cast<long long>(row.calls));
    }
    return;
  }
  const double kernel_ms = profile.kernel_ms();
  auto share = [&](double ms) { return kernel_ms > 0 ? 100.0 * ms / kernel_ms : 0.0; };
  std::map<std::string, KernelRow> categories;
  for (const auto& row : profile.rows) {
    auto& category = categories[row.category];
    category.name = row.category;
    category.total_ms += row.total_ms;
    category.calls += row.calls;
  }
  std::fprintf(out,
               "profile: %s, %.2f ms wall (medians), %.2f ms kernel time, "
               "idle gap %.2f ms (%.1f%% of the wall time)\n\n",
               profile.scope.c_str(), profile.wall_ms, kernel_ms, profile.wall_ms - kernel_ms,
               profile.wall_ms > 0 ? 100.0 * (profile.wall_ms - kernel_ms) / profile.wall_ms : 0.0);
  std::fprintf(out, "| category | total ms | calls | share of GPU time |\n|---|---:|---:|---:|\n");
  for (const auto& [name, row] : categories) {
    std::fprintf(out, "| %s | %.3f | %lld | %.1f%% |\n", name.c_str(), row.total_ms,
                 static_cast<long long>(row.calls), share(row.total_ms));
  }
  std::fprintf(out, "| idle gap (wall − kernels) | %.3f | | |\n", profile.wall_ms - kernel_ms);
  // Kernels overlapping on several streams can make the span shorter than their sum.
  const double gaps_ms = std::max(0.0, profile.span_ms - kernel_ms);
  std::fprintf(out, "| of which gaps between the profiled stretch's kernels | %.3f | | |\n",
               gaps_ms);
  std::fprintf(out, "| of which median wall − profiled span (run-to-run) | %.3f | | |\n\n",
               profile.wall_ms - kernel_ms - gaps_ms);
  std::fprintf(out, "| kernel | category | total ms | calls | share of GPU time |\n"
                    "|---|---|---:|---:|---:|\n");
  for (size_t i = 0; i < shown; ++i) {
    const auto& row = profile.rows[i];
    std::fprintf(out, "| %s | %s | %.3f | %lld | %.1f%% |\n", row.name.c_str(),
                 row.category.c_str(), row.total_ms, static_cast<long long>(row.calls),
                 share(row.total_ms));
  }
}

}  // namespace dspine::bench
