#include "ops/logit_rows_ops.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/StringUtil.h>

#include <cmath>

#include "core/error.h"
#include "kernels/logit_rows.h"
#include "ops/gspo_ops.h"

namespace dspine::ops {
static_assert(kNoDraw == kernels::kLogitRowsNoDraw);

namespace {

// Both scales reach the kernel as fp32 multiples of log2(e): they must stay finite there.
void check_scales(double logits_scale, double temperature) {
  if (!(logits_scale > 0) || !(temperature > 0))
    fail("logit rows: logits_scale ({}) and temperature ({}) must be > 0", logits_scale,
         temperature);
  constexpr double kLargest = 1e38;
  if (!(logits_scale < kLargest) || !(logits_scale / temperature < kLargest))
    fail("logit rows: logits_scale ({}) / temperature ({}) is too large for fp32 logits",
         logits_scale, temperature);
}

void check_uniforms(const at::Tensor& logits, const at::Tensor& uniforms) {
  if (logits.dim() != 2 || !uniforms.defined() || uniforms.dim() != 2 ||
      uniforms.size(0) != logits.size(0))
    fail("logit rows: uniforms must be [R, G] beside logits [R, V], got {} beside {}",
         uniforms.defined() ? c10::str(uniforms.sizes()) : "none", c10::str(logits.sizes()));
}

void require_cuda(const at::Tensor& logits) {
  if (!logits.is_cuda())
    fail("logit rows: the fused kernel needs CUDA logits, got {}", logits.device().str());
}

void launch(const at::Tensor& logits, double logits_scale, double sampling_scale,
            const at::Tensor& uniforms, const kernels::LogitRowOutputs& out) {
  const auto view = gspo_logits_view(logits, "logit rows");
  const int64_t draws = uniforms.defined() ? uniforms.size(1) : 0;
  const cudaError_t error = kernels::logit_rows(
      view, static_cast<float>(logits_scale), static_cast<float>(sampling_scale),
      uniforms.defined() ? uniforms.data_ptr<float>() : nullptr, draws, out,
      at::cuda::getCurrentCUDAStream());
  if (error != cudaSuccess) fail("logit rows: CUDA error: {}", cudaGetErrorString(error));
}

LogitRowDraws fused_draws(const at::Tensor& logits, const at::Tensor& uniforms, double logits_scale,
                          double temperature) {
  require_cuda(logits);
  if (uniforms.size(1) > kernels::kLogitRowsMaxDraws)
    fail("logit rows: at most {} draws per row, got {}", kernels::kLogitRowsMaxDraws,
         uniforms.size(1));
  const c10::cuda::CUDAGuard guard(logits.device());
  auto u = uniforms.to(logits.device(), at::kFloat).contiguous();
  const auto options = logits.options().dtype(at::kFloat);
  LogitRowDraws draws;
  draws.choices = at::empty(u.sizes(), options.dtype(at::kLong));
  draws.logprobs = at::empty(u.sizes(), options);
  draws.probs = at::empty(u.sizes(), options);
  kernels::LogitRowOutputs out;
  out.choices = draws.choices.data_ptr<int64_t>();
  out.logprobs = draws.logprobs.data_ptr<float>();
  out.probs = draws.probs.data_ptr<float>();
  launch(logits, logits_scale, logits_scale / temperature, u, out);
  return draws;
}

LogitRowDraws reference_draws(const at::Tensor& logits, const at::Tensor& uniforms,
                              double logits_scale, double temperature) {
  auto z = logits.to(at::kFloat);
  auto policy = at::log_softmax(z * logits_scale, -1);
  auto sampling = at::softmax(z * (logits_scale / temperature), -1);
  LogitRowDraws draws;
  draws.choices = sample_categorical(sampling, uniforms);
  draws.logprobs = policy.gather(1, draws.choices);
  draws.probs = sampling.gather(1, draws.choices);
  // As the kernel: a row holding NaN or +inf, or no finite logit, has nothing to draw from.
  const auto undrawable = at::logical_not(z.lt(INFINITY).all(1) & z.gt(-INFINITY).any(1))
                              .unsqueeze(1);
  draws.choices.masked_fill_(undrawable, kNoDraw);
  draws.logprobs.masked_fill_(undrawable, NAN);
  draws.probs.masked_fill_(undrawable, NAN);
  return draws;
}

}  // namespace

at::Tensor sample_categorical(const at::Tensor& probs, const at::Tensor& uniforms) {
  auto p = probs.to(at::kFloat);
  auto cdf = p.cumsum(1);
  auto total = cdf.select(1, cdf.size(1) - 1).unsqueeze(1);
  // Scaling the uniforms by the row total instead of normalising keeps the last bin reachable.
  auto targets = (uniforms.to(cdf.device(), at::kFloat) * total).contiguous();
  // The first column whose cumulative sum exceeds the target has nonzero probability; a target
  // that rounding leaves at the total takes the last column of nonzero probability.
  auto index = at::searchsorted(cdf, targets, /*out_int32=*/false, /*right=*/true);
  auto columns = at::arange(p.size(1), index.options());
  auto last_nonzero = at::where(p.gt(0), columns, 0).amax(1, /*keepdim=*/true);
  return at::where(index.lt(p.size(1)), index, last_nonzero);
}

void check_rows_drawn(const at::Tensor& choices, const std::string& what) {
  const auto undrawn = choices.eq(kNoDraw).any(1).nonzero();
  if (undrawn.numel() > 0)
    fail("{}: row {} of the logits holds NaN or +inf, or no finite value: nothing to draw from",
         what, undrawn[0][0].item<int64_t>());
}

LogitRowDraws sample_logit_rows(const at::Tensor& logits, const at::Tensor& uniforms,
                                double logits_scale, double temperature, bool fused) {
  check_scales(logits_scale, temperature);
  check_uniforms(logits, uniforms);
  return fused ? fused_draws(logits, uniforms, logits_scale, temperature)
               : reference_draws(logits, uniforms, logits_scale, temperature);
}

std::pair<at::Tensor, at::Tensor> logit_row_argmax_lse(const at::Tensor& logits, bool fused) {
  if (!fused) {
    auto z = logits.to(at::kFloat);
    return {z.argmax(-1), at::logsumexp(z, -1)};
  }
  require_cuda(logits);
  const c10::cuda::CUDAGuard guard(logits.device());
  auto argmax = at::empty({logits.size(0)}, logits.options().dtype(at::kLong));
  auto lse = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
  kernels::LogitRowOutputs out;
  out.argmax = argmax.data_ptr<int64_t>();
  out.lse = lse.data_ptr<float>();
  launch(logits, 1.0, 1.0, at::Tensor(), out);
  return {argmax, lse};
}

}  // namespace dspine::ops
