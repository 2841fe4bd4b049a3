#include "ops/gspo_ops.h"

#include <string>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/StringUtil.h>

#include "core/error.h"
#include "kernels/gspo_seam_kernels.h"
#include "kernels/gspo_vocab.h"

namespace dspine::ops {
namespace {

void check_cuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) fail("gspo {}: CUDA error: {}", what, cudaGetErrorString(error));
}

void check_token_tensor(const at::Tensor& t, const char* name, int64_t num_tokens,
                        const at::Device& device) {
  if (!t.defined()) fail("gspo fused seam: `{}` is missing", name);
  if (t.dim() != 1 || t.size(0) != num_tokens)
    fail("gspo fused seam: `{}` has shape {} but must be [{}] like every per-token input", name,
         c10::str(t.sizes()), num_tokens);
  if (t.device() != device)
    fail("gspo fused seam: `{}` is on {} but the seam runs on {}", name, t.device().str(),
         device.str());
  if (!t.is_contiguous()) fail("gspo fused seam: `{}` must be contiguous", name);
}

void check_dtype(const at::Tensor& t, const char* name, std::initializer_list<at::ScalarType> ok) {
  for (at::ScalarType type : ok)
    if (t.scalar_type() == type) return;
  std::string names;
  for (at::ScalarType type : ok) names += std::string(names.empty() ? "" : "/") + c10::toString(type);
  fail("gspo fused seam: `{}` has dtype {} but must be {}", name, c10::toString(t.scalar_type()),
       names);
}

kernels::GspoSeamTokens to_tokens(const GspoSeamArgs& args, const at::Device& device,
                                  int64_t num_tokens, int64_t num_segments) {
  if (args.num_segments != num_segments)
    fail("gspo fused seam: num_segments {} differs from the workspace's {}", args.num_segments,
         num_segments);
  check_token_tensor(args.logprobs, "logprobs", num_tokens, device);
  check_token_tensor(args.target, "target", num_tokens, device);
  check_token_tensor(args.old_logprobs, "old_logprobs", num_tokens, device);
  check_token_tensor(args.advantages, "advantages", num_tokens, device);
  check_token_tensor(args.segment, "segment", num_tokens, device);
  check_token_tensor(args.label_counts, "label_counts", num_tokens, device);
  check_dtype(args.logprobs, "logprobs", {at::kFloat});
  check_dtype(args.target, "target", {at::kLong});
  check_dtype(args.old_logprobs, "old_logprobs", {at::kFloat});
  check_dtype(args.advantages, "advantages", {at::kFloat});
  check_dtype(args.segment, "segment", {at::kInt, at::kLong});
  check_dtype(args.label_counts, "label_counts", {at::kInt, at::kLong, at::kFloat});

  kernels::GspoSeamTokens tokens;
  tokens.logprobs = args.logprobs.data_ptr<float>();
  tokens.target = args.target.data_ptr<int64_t>();
  tokens.old_logprobs = args.old_logprobs.data_ptr<float>();
  tokens.advantages = args.advantages.data_ptr<float>();
  tokens.segment = args.segment.data_ptr();
  tokens.segment_type = args.segment.scalar_type() == at::kInt ? kernels::GspoIndexType::kInt32
                                                               : kernels::GspoIndexType::kInt64;
  tokens.label_counts = args.label_counts.data_ptr();
  switch (args.label_counts.scalar_type()) {
    case at::kInt: tokens.count_type = kernels::GspoCountType::kInt32; break;
    case at::kLong: tokens.count_type = kernels::GspoCountType::kInt64; break;
    default: tokens.count_type = kernels::GspoCountType::kFloat32; break;
  }
  tokens.num_tokens = num_tokens;
  tokens.num_segments = num_segments;
  return tokens;
}

void check_row_tensor(const at::Tensor& t, const char* name, const at::Tensor& logits,
                      at::ScalarType dtype) {
  if (!t.defined() || t.dim() != 1 || t.size(0) != logits.size(0) || !t.is_contiguous() ||
      t.device() != logits.device() || t.scalar_type() != dtype)
    fail("gspo vocab: `{}` must be a contiguous [{}] {} tensor on {}", name, logits.size(0),
         c10::toString(dtype), logits.device().str());
}

}  // namespace

kernels::GspoLogits gspo_logits_view(const at::Tensor& logits, const char* what) {
  if (!logits.is_cuda() || logits.dim() != 2)
    fail("gspo {}: logits must be a [N, V] CUDA tensor, got {} on {}", what,
         c10::str(logits.sizes()), logits.device().str());
  if (logits.scalar_type() != at::kBFloat16 && logits.scalar_type() != at::kFloat)
    fail("gspo {}: logits dtype {} is not bf16 or fp32", what, c10::toString(logits.scalar_type()));
  if (logits.stride(1) != 1) fail("gspo {}: logits need unit column stride", what);
  kernels::GspoLogits view;
  view.data = logits.data_ptr();
  view.type = logits.scalar_type() == at::kBFloat16 ? kernels::GspoLogitsType::kBFloat16
                                                    : kernels::GspoLogitsType::kFloat32;
  view.rows = logits.size(0);
  view.vocab = logits.size(1);
  view.row_stride = logits.stride(0);
  return view;
}

GspoFusedSeam::GspoFusedSeam(int64_t num_tokens, int64_t num_segments, const at::Device& device)
    : num_tokens_(num_tokens), num_segments_(num_segments) {
  if (!device.is_cuda()) fail("gspo fused seam: needs a CUDA device, got {}", device.str());
  if (num_segments < 1 || num_segments > (int64_t(1) << 30))
    fail("gspo fused seam: num_segments {} must be in [1, 2^30]", num_segments);
  const c10::cuda::CUDAGuard guard(device);
  const size_t bytes = kernels::gspo_seam_workspace_bytes(num_tokens, num_segments);
  workspace_ = at::empty({int64_t(bytes / 4)}, at::TensorOptions().dtype(at::kFloat).device(device));
}

namespace {

kernels::GspoSeamScalars launch_scalars(const GspoFinishArgs& scalars) {
  kernels::GspoSeamScalars launch;
  launch.ratio_low = static_cast<float>(1.0 - scalars.eps_low);
  launch.ratio_high = static_cast<float>(1.0 + scalars.eps_high);
  launch.divisor = static_cast<float>(scalars.divisor);
  launch.coefficient_scale = static_cast<float>(scalars.coefficient_scale);
  return launch;
}

}  // namespace

at::Tensor GspoFusedSeam::local(const GspoSeamArgs& args, const GspoFinishArgs& scalars,
                                const at::Tensor& coefficient) {
  return block2(kernels::gspo_seam_local, "seam (local)", args, scalars, coefficient);
}

void GspoFusedSeam::reduce(const GspoSeamArgs& args) {
  const c10::cuda::CUDAGuard guard(workspace_.device());
  const auto tokens = to_tokens(args, workspace_.device(), num_tokens_, num_segments_);
  check_cuda(kernels::gspo_seam_reduce(tokens, workspace_.data_ptr(),
                                       at::cuda::getCurrentCUDAStream()),
             "seam reduce");
}

at::Tensor GspoFusedSeam::segment_sums() const {
  return workspace_.narrow(0, 0, 2 * num_segments_).view({2, num_segments_});
}

at::Tensor GspoFusedSeam::finish(const GspoSeamArgs& args, const GspoFinishArgs& scalars,
                                 const at::Tensor& coefficient) {
  return block2(kernels::gspo_seam_finish, "seam finish", args, scalars, coefficient);
}

at::Tensor GspoFusedSeam::block2(Block2Launch launch, const char* what, const GspoSeamArgs& args,
                                 const GspoFinishArgs& scalars, const at::Tensor& coefficient) {
  const c10::cuda::CUDAGuard guard(workspace_.device());
  const auto tokens = to_tokens(args, workspace_.device(), num_tokens_, num_segments_);
  if (coefficient.defined()) {
    check_token_tensor(coefficient, "coefficient", num_tokens_, workspace_.device());
    check_dtype(coefficient, "coefficient", {at::kFloat});
  }
  at::Tensor out = at::empty({4}, workspace_.options());
  check_cuda(launch(tokens, launch_scalars(scalars), workspace_.data_ptr(),
                    coefficient.defined() ? coefficient.data_ptr<float>() : nullptr,
                    out.data_ptr<float>(), at::cuda::getCurrentCUDAStream()),
             what);
  return out;
}

int GspoFusedSeam::status() const {
  at::Tensor status =
      workspace_.narrow(0, kernels::gspo_seam_status_offset(num_segments_), 1).view(at::kInt);
  if (vocab_status_.defined()) status = status.bitwise_or(vocab_status_);
  return status.item<int>();
}

int* GspoFusedSeam::vocab_status_pointer() {
  if (!vocab_status_.defined())
    vocab_status_ = at::zeros({1}, workspace_.options().dtype(at::kInt));
  return vocab_status_.data_ptr<int>();
}

void gspo_vocab_forward(const at::Tensor& logits, const at::Tensor& target, double logits_scale,
                        GspoFusedSeam& seam, at::Tensor& logprobs, at::Tensor& lse) {
  const auto view = gspo_logits_view(logits, "vocab forward");
  const c10::cuda::CUDAGuard guard(logits.device());
  check_row_tensor(target, "target", logits, at::kLong);
  const auto options = logits.options().dtype(at::kFloat);
  logprobs = at::empty({view.rows}, options);
  lse = at::empty({view.rows}, options);
  check_cuda(kernels::gspo_vocab_forward(view, target.data_ptr<int64_t>(),
                                         static_cast<float>(logits_scale),
                                         logprobs.data_ptr<float>(), lse.data_ptr<float>(),
                                         seam.vocab_status_pointer(), at::cuda::getCurrentCUDAStream()),
             "vocab forward");
}

void gspo_vocab_backward(const at::Tensor& logits, const at::Tensor& target,
                         const at::Tensor& lse, const at::Tensor& coefficient,
                         double logits_scale, at::Tensor& grad, bool accumulate) {
  const auto view = gspo_logits_view(logits, "vocab backward");
  const c10::cuda::CUDAGuard guard(logits.device());
  check_row_tensor(target, "target", logits, at::kLong);
  check_row_tensor(lse, "lse", logits, at::kFloat);
  check_row_tensor(coefficient, "coefficient", logits, at::kFloat);
  if (!grad.defined() || grad.sizes() != logits.sizes() ||
      grad.scalar_type() != logits.scalar_type() || grad.device() != logits.device() ||
      grad.stride(1) != 1)
    fail("gspo vocab backward: the logits gradient must be a {} {} tensor on {} with unit "
         "column stride",
         c10::str(logits.sizes()), c10::toString(logits.scalar_type()),
         logits.device().str());
  check_cuda(kernels::gspo_vocab_backward(view, target.data_ptr<int64_t>(), lse.data_ptr<float>(),
                                          coefficient.data_ptr<float>(),
                                          static_cast<float>(logits_scale), grad.data_ptr(),
                                          grad.stride(0), accumulate,
                                          at::cuda::getCurrentCUDAStream()),
             "vocab backward");
}

}  // namespace dspine::ops
