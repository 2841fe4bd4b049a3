#include "bench/cpu_memory.h"

#include <algorithm>
#include <atomic>

#include <c10/core/CPUAllocator.h>

namespace dspine::bench {
namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};

struct Header {
  int64_t bytes;
};

// Delegates to the default CPU allocator; a small aligned header remembers each block's size.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t bytes) override {
    c10::DataPtr inner = base_->allocate(bytes + kHeader);
    auto* raw = static_cast<char*>(inner.get());
    reinterpret_cast<Header*>(raw)->bytes = static_cast<int64_t>(bytes);
    const int64_t now = g_current += static_cast<int64_t>(bytes);
    int64_t peak = g_peak.load();
    while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
    }
    auto* context = new c10::DataPtr(std::move(inner));
    return {raw + kHeader, context, &release, c10::Device(c10::kCPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  static constexpr size_t kHeader = 64;  // keeps the 64-byte alignment of the default allocator
  static void release(void* context) {
    auto* inner = static_cast<c10::DataPtr*>(context);
    g_current -= reinterpret_cast<Header*>(inner->get())->bytes;
    delete inner;
  }
  c10::Allocator* base_;
};

}  // namespace

CpuMemoryTracker& CpuMemoryTracker::install() {
  static CountingAllocator allocator(c10::GetCPUAllocator());
  static CpuMemoryTracker tracker;
  static bool installed = [] {
    c10::SetCPUAllocator(&allocator, /*priority=*/100);
    return true;
  }();
  (void)installed;
  return tracker;
}

int64_t CpuMemoryTracker::current_bytes() const { return g_current.load(); }
int64_t CpuMemoryTracker::peak_bytes() const { return g_peak.load(); }
void CpuMemoryTracker::reset_peak() { g_peak.store(g_current.load()); }

}  // namespace dspine::bench
