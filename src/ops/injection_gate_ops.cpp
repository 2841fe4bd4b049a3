#include "ops/injection_gate_ops.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "core/error.h"
#include "kernels/injection_gate.h"
#include "ops/kernel_launch.h"

namespace dspine::ops {
namespace {

// Whether the shapes fit each other: y [B, T, r + 3m], h [B, T, H], table [V, 2m], ids [B],
// bias [m], T ≥ 2.
bool shapes_fit(const at::Tensor& y, const at::Tensor& h, const at::Tensor& anchor_table,
                const at::Tensor& anchor_ids, const at::Tensor& bias, int64_t rank) {
  if (y.dim() != 3 || h.dim() != 3 || anchor_table.dim() != 2 || anchor_ids.dim() != 1 ||
      bias.dim() != 1 || anchor_table.size(1) % 2 != 0) {
    return false;
  }
  const int64_t m = anchor_table.size(1) / 2;
  return m > 0 && rank > 0 && y.size(2) == rank + 3 * m && bias.size(0) == m &&
         h.size(0) == y.size(0) && h.size(1) == y.size(1) && y.size(1) >= 2 &&
         anchor_ids.size(0) == y.size(0) && anchor_ids.scalar_type() == at::kLong;
}

}  // namespace

at::Tensor injection_gate_reference(const at::Tensor& y, const at::Tensor& h,
                                    const at::Tensor& anchor_table, const at::Tensor& anchor_ids,
                                    const at::Tensor& bias, int64_t rank, double eps) {
  if (!shapes_fit(y, h, anchor_table, anchor_ids, bias, rank)) {
    fail(
        "injection gate: y {}, h {}, anchor table {}, anchor ids {} and bias {} do not fit rank {}",
        c10::str(y.sizes()), c10::str(h.sizes()), c10::str(anchor_table.sizes()),
        c10::str(anchor_ids.sizes()), c10::str(bias.sizes()), rank);
  }
  const int64_t rows = y.size(0), slots = y.size(1), m = anchor_table.size(1) / 2;
  const auto yf = y.to(at::kFloat);
  const auto readout = yf.narrow(-1, 0, rank);
  const auto scale = at::rsqrt(readout.pow(2).mean(-1, /*keepdim=*/true) + eps);  // [B, T, 1]
  const auto receiver_terms = yf.narrow(-1, rank, m) * scale;
  const auto predecessor_terms = yf.narrow(-1, rank + m, 2 * m) * scale;  // gate, message
  const auto anchor =
      anchor_table.index_select(0, anchor_ids).to(at::kFloat).view({rows, 1, 2 * m});
  // Slot t's predecessor: the anchor for t = 1, slot t − 1 after it.
  const auto pred = at::cat({anchor, predecessor_terms.narrow(1, 1, slots - 2)}, 1);
  const auto gate = at::sigmoid(receiver_terms.narrow(1, 1, slots - 1) + bias.to(at::kFloat) +
                                pred.narrow(-1, 0, m));
  const auto rms = h.to(at::kFloat).pow(2).mean(-1, /*keepdim=*/true).sqrt();
  const auto written = rms.narrow(1, 1, slots - 1) * gate * pred.narrow(-1, m, m);
  return at::cat({at::zeros({rows, 1, m}, written.options()), written}, 1).to(y.scalar_type());
}

bool injection_gate_fusable(const at::Tensor& y, const at::Tensor& h,
                            const at::Tensor& anchor_table, const at::Tensor& anchor_ids,
                            const at::Tensor& bias, int64_t rank) {
  kernels::DType type = kernels::DType::kFloat32;
  if (!y.is_cuda() || !kernel_dtype(y.scalar_type(), &type) ||
      !shapes_fit(y, h, anchor_table, anchor_ids, bias, rank) || !y.is_contiguous() ||
      !h.is_contiguous() || !anchor_table.is_contiguous() || !bias.is_contiguous()) {
    return false;
  }
  for (const auto* t : {&h, &anchor_table, &bias}) {
    if (t->device() != y.device() || t->scalar_type() != y.scalar_type()) return false;
  }
  return anchor_ids.device() == y.device();
}

at::Tensor injection_gate_fused(const at::Tensor& y, const at::Tensor& h,
                                const at::Tensor& anchor_table, const at::Tensor& anchor_ids,
                                const at::Tensor& bias, int64_t rank, double eps) {
  if (!injection_gate_fusable(y, h, anchor_table, anchor_ids, bias, rank)) {
    fail(
        "fused injection gate: y {} {} on {}, h {}, anchor table {}, anchor ids {} and bias {} "
        "(rank {}) are not taken: CUDA fp32/fp16/bf16 of one dtype, y and h contiguous, "
        "y [B, T ≥ 2, r + 3m], h [B, T, H], table [V, 2m], int64 ids [B], bias [m]",
        c10::toString(y.scalar_type()), c10::str(y.sizes()), y.device().str(), c10::str(h.sizes()),
        c10::str(anchor_table.sizes()), c10::str(anchor_ids.sizes()), c10::str(bias.sizes()), rank);
  }
  const c10::cuda::CUDAGuard guard(y.device());
  kernels::InjectionGateShape shape;
  shape.rows = y.size(0) * y.size(1);
  shape.slots = y.size(1);
  shape.rank = rank;
  shape.message = anchor_table.size(1) / 2;
  shape.hidden = h.size(2);
  shape.eps = static_cast<float>(eps);
  kernel_dtype(y.scalar_type(), &shape.type);
  auto out = at::empty({y.size(0), y.size(1), shape.message}, y.options());
  check_launch(kernels::injection_gate_forward(y.data_ptr(), h.data_ptr(), anchor_table.data_ptr(),
                                               anchor_ids.data_ptr<int64_t>(), anchor_ids.stride(0),
                                               bias.data_ptr(), out.data_ptr(), shape,
                                               at::cuda::getCurrentCUDAStream()),
               "injection gate", y);
  return out;
}

}  // namespace dspine::ops
