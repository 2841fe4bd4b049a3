#include "ops/block_attention_ops.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/torch.h>

#include "core/error.h"
#include "kernels/block_attention.h"
#include "ops/kernel_launch.h"

namespace dspine::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

kernels::BlockAttentionShape shape_of(const at::Tensor& q, const at::Tensor& k,
                                      int64_t block_size) {
  kernels::BlockAttentionShape s;
  if (q.dim() != 4 || k.dim() != 4 || block_size < 1 || q.size(1) % block_size != 0) return s;
  s.rows = q.size(0);
  s.blocks = q.size(1) / block_size;
  s.block_size = block_size;
  s.heads = q.size(2);
  s.head_dim = q.size(3);
  s.kv_heads = k.size(2);
  s.context = k.size(1) - q.size(1);
  return s;
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& anchors, const at::Tensor& keep, int64_t block_size) {
  const auto s = shape_of(q, k, block_size);
  const bool ok = block_attention_fusable(q, k, block_size) && v.sizes() == k.sizes() &&
                  v.scalar_type() == q.scalar_type() && k.size(0) == q.size(0) &&
                  k.size(3) == q.size(3) && anchors.dim() == 2 && anchors.size(0) == s.rows &&
                  anchors.size(1) == s.blocks && keep.sizes() == anchors.sizes() &&
                  anchors.device() == q.device() && keep.device() == q.device();
  if (!ok) {
    fail(
        "fused block attention needs CUDA bf16 q [B, N*bs, H, D], k and v [B, S + N*bs, KVH, D] "
        "(D 64 or 128, bs * H/KVH <= 64) and anchors/keep [B, N] on the same device; got q {} {} "
        "on {}, k {}, v {}, anchors {}, keep {}, block size {}",
        c10::str(q.sizes()), c10::toString(q.scalar_type()), q.device().str(), c10::str(k.sizes()),
        c10::str(v.sizes()), c10::str(anchors.sizes()), c10::str(keep.sizes()), block_size);
  }
}

struct BlockAttentionFunction : public torch::autograd::Function<BlockAttentionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& anchors, const at::Tensor& keep,
                            int64_t block_size, double scale) {
    const c10::cuda::CUDAGuard guard(q.device());
    const auto shape = shape_of(q, k, block_size);
    auto qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
    auto anchors_c = anchors.to(at::kLong).contiguous();
    // A bool mask is read in place as bytes (0/1): no conversion kernel between the layers' calls.
    auto keep_c = (keep.scalar_type() == at::kBool ? keep.view(at::kByte) : keep.to(at::kByte))
                      .contiguous();
    auto out = at::empty_like(qc);
    auto lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
    check_launch(kernels::block_attention_forward(
                     shape, qc.data_ptr(), kc.data_ptr(), vc.data_ptr(),
                     anchors_c.data_ptr<int64_t>(), keep_c.data_ptr<uint8_t>(),
                     static_cast<float>(scale), out.data_ptr(), lse.data_ptr<float>(),
                     at::cuda::getCurrentCUDAStream()),
                 "block attention forward", q);
    ctx->save_for_backward({qc, kc, vc, out, lse, anchors_c, keep_c});
    ctx->saved_data["block_size"] = block_size;
    ctx->saved_data["scale"] = scale;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const auto &anchors = saved[5], &keep = saved[6];
    const int64_t block_size = ctx->saved_data["block_size"].toInt();
    const double scale = ctx->saved_data["scale"].toDouble();
    const c10::cuda::CUDAGuard guard(q.device());
    auto dout = grads[0].contiguous();
    auto delta = at::empty_like(lse);
    auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
    check_launch(kernels::block_attention_backward(
                     shape_of(q, k, block_size), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                     out.data_ptr(), dout.data_ptr(), lse.data_ptr<float>(),
                     anchors.data_ptr<int64_t>(), keep.data_ptr<uint8_t>(),
                     static_cast<float>(scale), delta.data_ptr<float>(), dq.data_ptr(),
                     dk.data_ptr(), dv.data_ptr(), at::cuda::getCurrentCUDAStream()),
                 "block attention backward", q);
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool block_attention_fusable(const at::Tensor& q, const at::Tensor& k, int64_t block_size) {
  if (!q.is_cuda() || q.scalar_type() != at::kBFloat16 || k.device() != q.device() ||
      k.scalar_type() != q.scalar_type()) {
    return false;
  }
  const auto s = shape_of(q, k, block_size);
  return s.rows > 0 && k.size(0) == q.size(0) && k.size(3) == q.size(3) &&
         kernels::block_attention_supported(s);
}

bool block_attention_heads_supported(int64_t heads, int64_t kv_heads, int64_t head_dim,
                                     int64_t block_size) {
  kernels::BlockAttentionShape s;
  s.rows = 1;
  s.blocks = 1;
  s.block_size = block_size;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.head_dim = head_dim;
  return kernels::block_attention_supported(s);
}

at::Tensor block_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& anchors, const at::Tensor& keep, int64_t block_size,
                           double scale) {
  if (!(scale > 0.0)) fail("fused block attention needs a softmax scale > 0, got {}", scale);
  check_inputs(q, k, v, anchors, keep, block_size);
  return BlockAttentionFunction::apply(q, k, v, anchors, keep, block_size, scale);
}

}  // namespace dspine::ops
