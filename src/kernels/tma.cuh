// Hopper's tensor memory accelerator (TMA): whole tiles copied global -> shared by one thread,
// their arrival counted in bytes on a shared-memory barrier (mbarrier), for the block attention
// forward and the GEMM (docs/kernels.md, "Block attention", "GEMM"). The host describes a tensor
// and its tile shape once per launch (a CUtensorMap); the copy writes the tile in the 128-byte swizzle layout of
// kernels/wgmma.cuh, so wgmma reads it as it reads the tiles the threads copy themselves.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dspine::kernels::tma {

// A map of a 4-D bf16 tensor (dims and byte strides innermost first; strides[0] is dim 1's),
// copied in boxes of `box` elements per dimension, 128-byte swizzled, zero outside the tensor.
// Returns cudaErrorNotSupported when the driver lacks the entry point.
inline cudaError_t encode_bf16_map(CUtensorMap* map, const void* base, const uint64_t (&dims)[4],
                                   const uint64_t (&strides)[3], const uint32_t (&box)[4]) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return cudaErrorNotSupported;
  cuuint64_t global_dims[4], global_strides[3];
  cuuint32_t box_dims[4], element_strides[4] = {1, 1, 1, 1};
  for (int i = 0; i < 4; ++i) {
    global_dims[i] = dims[i];
    box_dims[i] = box[i];
  }
  for (int i = 0; i < 3; ++i) global_strides[i] = strides[i];
  const CUresult result = encode(
      map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), global_dims,
      global_strides, box_dims, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

// A barrier expecting one arrival per phase (plus the bytes announced by expect_bytes).
__device__ __forceinline__ void init_barrier(uint32_t barrier) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(barrier) : "memory");
}
// A barrier expecting `count` arrivals per phase (e.g. one per consumer warpgroup).
__device__ __forceinline__ void init_barrier(uint32_t barrier, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(count) : "memory");
}
// One arrival of the calling thread on the barrier's current phase.
__device__ __forceinline__ void arrive(uint32_t barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(barrier) : "memory");
}
// Makes initialized barriers visible to the copy engine (before the CTA's first barrier).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// The calling thread's arrival for this phase, which completes once `bytes` more have arrived.
__device__ __forceinline__ void expect_bytes(uint32_t barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier),
               "r"(bytes)
               : "memory");
}
// Waits until the barrier's phase with parity `phase` has completed.
__device__ __forceinline__ void wait_barrier(uint32_t barrier, uint32_t phase) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(barrier),
      "r"(phase)
      : "memory");
}
// One box of `map` at element coordinates (c0..c3) into shared memory at `dst`, counted on
// `barrier`.
__device__ __forceinline__ void copy_box(uint32_t dst, const CUtensorMap* map, uint32_t barrier,
                                         int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(barrier)
      : "memory");
}

// One box of `map` at element coordinates (c0..c3) from shared memory at `src` to global memory
// (parts outside the tensor are not written), in the calling thread's current bulk group.
__device__ __forceinline__ void store_box(const CUtensorMap* map, uint32_t src, int c0, int c1,
                                          int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
// Closes the calling thread's stores issued so far into one bulk group.
__device__ __forceinline__ void commit_stores() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until at most `Pending` of the thread's store groups still read their shared memory.
template <int Pending>
__device__ __forceinline__ void wait_stores_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(Pending) : "memory");
}
// Waits until at most `Pending` of the thread's store groups are still in flight.
template <int Pending>
__device__ __forceinline__ void wait_stores() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(Pending) : "memory");
}

#endif

}  // namespace dspine::kernels::tma
