#include "kernels/master_adamw.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "kernels/norm_swiglu_common.cuh"

namespace dspine::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kPack = 4;  // elements per thread per iteration: one float4 of each fp32 tensor

using detail::from_float;
using detail::to_float;

struct Corrections {
  float bias1, bias2_sqrt;
};

// As ATen's FusedAdamMathFunctor: both corrections from the fp32 step count, in fp32.
__device__ __forceinline__ Corrections corrections(const AdamWHyper& h) {
  return {1 - std::pow(h.beta1, h.step), std::sqrt(1 - std::pow(h.beta2, h.step))};
}

// ATen's adam_math (ADAMW mode, no amsgrad, not maximize), expression for expression, so that
// the compiler forms the same fused multiply-adds.
__device__ __forceinline__ void adamw_update(float& param, float grad, float& exp_avg,
                                             float& exp_avg_sq, const AdamWHyper& h,
                                             const Corrections& c) {
  if (h.grad_scale != 0) grad /= h.grad_scale;
  if (h.weight_decay != 0) param -= h.lr * h.weight_decay * param;
  exp_avg = std::fma(h.beta1, exp_avg, std::fma(-h.beta1, grad, grad));
  exp_avg_sq = std::fma(h.beta2, exp_avg_sq, std::fma(-h.beta2, grad * grad, grad * grad));
  const float step_size = h.lr / c.bias1;
  const float denom = (std::sqrt(exp_avg_sq) / c.bias2_sqrt) + h.eps;
  param -= step_size * exp_avg / denom;
}

template <typename G, typename W>
__device__ __forceinline__ void update_one(const MasterAdamWTensors& t, int64_t i,
                                           const AdamWHyper& h, const Corrections& c) {
  float param = t.master[i], exp_avg = t.exp_avg[i], exp_avg_sq = t.exp_avg_sq[i];
  adamw_update(param, to_float(static_cast<const G*>(t.grad)[i]), exp_avg, exp_avg_sq, h, c);
  t.master[i] = param;
  t.exp_avg[i] = exp_avg;
  t.exp_avg_sq[i] = exp_avg_sq;
  if (t.weights) static_cast<W*>(t.weights)[i] = from_float<W>(param);
}

// Packs of kPack elements through 16-byte fp32 loads (8-byte for bf16); the tail and unaligned
// tensors element by element.
template <typename G, typename W, bool kVector>
__global__ void __launch_bounds__(kThreads)
    master_adamw_kernel(MasterAdamWTensors t, AdamWHyper h) {
  const Corrections c = corrections(h);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t scalar_from = 0;
  if constexpr (kVector) {
    using GPack = std::conditional_t<sizeof(G) == 4, float4, uint2>;
    using WPack = std::conditional_t<sizeof(W) == 4, float4, uint2>;
    const int64_t packs = t.numel / kPack;
    for (int64_t p = first; p < packs; p += stride) {
      float4 param = reinterpret_cast<float4*>(t.master)[p];
      float4 m = reinterpret_cast<float4*>(t.exp_avg)[p];
      float4 v = reinterpret_cast<float4*>(t.exp_avg_sq)[p];
      const GPack g_pack = reinterpret_cast<const GPack*>(t.grad)[p];
      const G* g = reinterpret_cast<const G*>(&g_pack);
      adamw_update(param.x, to_float(g[0]), m.x, v.x, h, c);
      adamw_update(param.y, to_float(g[1]), m.y, v.y, h, c);
      adamw_update(param.z, to_float(g[2]), m.z, v.z, h, c);
      adamw_update(param.w, to_float(g[3]), m.w, v.w, h, c);
      reinterpret_cast<float4*>(t.master)[p] = param;
      reinterpret_cast<float4*>(t.exp_avg)[p] = m;
      reinterpret_cast<float4*>(t.exp_avg_sq)[p] = v;
      if (t.weights) {
        WPack w_pack;
        W* w = reinterpret_cast<W*>(&w_pack);
        w[0] = from_float<W>(param.x);
        w[1] = from_float<W>(param.y);
        w[2] = from_float<W>(param.z);
        w[3] = from_float<W>(param.w);
        reinterpret_cast<WPack*>(t.weights)[p] = w_pack;
      }
    }
    scalar_from = packs * kPack;
  }
  for (int64_t i = scalar_from + first; i < t.numel; i += stride) update_one<G, W>(t, i, h, c);
}

bool aligned(const void* pointer, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(pointer) % bytes == 0;
}

template <typename G, typename W>
cudaError_t launch(const MasterAdamWTensors& t, const AdamWHyper& h, cudaStream_t stream) {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int64_t work = (t.numel + kPack - 1) / kPack;
  const int blocks = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>((work + kThreads - 1) / kThreads, 8LL * sms)));
  const bool vector = aligned(t.master, 16) && aligned(t.exp_avg, 16) &&
                      aligned(t.exp_avg_sq, 16) && aligned(t.grad, kPack * sizeof(G)) &&
                      (!t.weights || aligned(t.weights, kPack * sizeof(W)));
  if (vector) {
    master_adamw_kernel<G, W, true><<<blocks, kThreads, 0, stream>>>(t, h);
  } else {
    master_adamw_kernel<G, W, false><<<blocks, kThreads, 0, stream>>>(t, h);
  }
  return cudaGetLastError();
}

template <typename G>
cudaError_t launch_for_weights(const MasterAdamWTensors& t, const AdamWHyper& h,
                               cudaStream_t stream) {
  return t.weight_type == DType::kFloat32 ? launch<G, float>(t, h, stream)
                                          : launch<G, __nv_bfloat16>(t, h, stream);
}

bool takes(DType type) { return type == DType::kFloat32 || type == DType::kBFloat16; }

}  // namespace

bool master_adamw_supported(DType grad_type, DType weight_type) {
  return takes(grad_type) && takes(weight_type);
}

cudaError_t master_adamw_step(const MasterAdamWTensors& tensors, const AdamWHyper& hyper,
                              cudaStream_t stream) {
  if (!master_adamw_supported(tensors.grad_type, tensors.weight_type)) {
    return cudaErrorInvalidValue;
  }
  if (tensors.numel == 0) return cudaSuccess;
  return tensors.grad_type == DType::kFloat32
             ? launch_for_weights<float>(tensors, hyper, stream)
             : launch_for_weights<__nv_bfloat16>(tensors, hyper, stream);
}

}  // namespace dspine::kernels
