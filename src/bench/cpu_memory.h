// Tensor memory accounting on CPU: wraps LibTorch's CPU allocator to track the bytes held by
// tensors now and at peak, so a phase's peak (e.g. the CE-only prepass) can be measured.
#pragma once

#include <cstdint>

namespace dspine::bench {

class CpuMemoryTracker {
 public:
  // Installs the counting allocator (once per process); later CPU tensors are counted.
  static CpuMemoryTracker& install();
  int64_t current_bytes() const;
  int64_t peak_bytes() const;
  void reset_peak();  // peak := current
};

}  // namespace dspine::bench
