// Asynchronous global -> shared memory copies (cp.async, sm_80+), shared by the kernels that
// stream tiles or rows through shared memory without holding the loads in registers. A thread's
// copies are visible to that thread after wait_async; other threads need a barrier as well.
#pragma once

#include <cstdint>

namespace dspine::kernels::detail {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared.
__device__ __forceinline__ void copy16_async(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(dst)), "l"(src));
}
// The same, zero-filled when !valid (src is then not read).
__device__ __forceinline__ void copy16_async(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(valid ? 16 : 0));
}
// 4 bytes global -> shared (through L1), zero-filled when !valid.
__device__ __forceinline__ void copy4_async(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(valid ? 4 : 0));
}
// Closes the thread's outstanding copies into one group.
__device__ __forceinline__ void commit_async() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `Pending` of the thread's groups are still in flight.
template <int Pending>
__device__ __forceinline__ void wait_async() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}

}  // namespace dspine::kernels::detail
