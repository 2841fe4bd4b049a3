// Element types the fused RMSNorm / SwiGLU kernels accept; the ops layer maps tensor dtypes here.
#pragma once

namespace dspine::kernels {

enum class DType { kFloat32, kFloat16, kBFloat16 };

}  // namespace dspine::kernels
