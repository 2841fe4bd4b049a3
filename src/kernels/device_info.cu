// Placeholder until the fused kernels land: proves the sm_90 toolchain works on every machine.
#include "kernels/device_info.h"

#include <cuda_runtime.h>

namespace dspine::kernels {

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error on CPU-only machines
    return 0;
  }
  return count;
}

}  // namespace dspine::kernels
