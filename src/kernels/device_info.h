#pragma once

namespace dspine::kernels {

// Number of CUDA devices visible to this process; 0 on machines without a GPU or driver.
int cuda_device_count();

}  // namespace dspine::kernels
