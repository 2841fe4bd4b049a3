// The fused injection gate of the decoding path (src/kernels/injection_gate.cu) against its ATen
// reference: fp32 to 1e-5 relative; bf16 against the reference evaluated in fp32 on the same bf16
// inputs (relative error ≤ 1e-2 of the norm, cosine ≥ 0.9999), as for the other bf16 kernels;
// blocks of 2 and 8 slots, anchor ids read through a stride, a readout row of zeros (its
// feature norm's eps), slot 0 left zero; and what the kernel refuses.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "common/parity.h"
#include "common/require_cuda.h"
#include "ops/injection_gate_ops.h"

namespace dspine {
namespace {

using testing::cosine;
using testing::norm_relative_error;

const torch::Device kCuda(torch::kCUDA, 0);

struct Shape {
  int64_t rows, slots, rank, message, hidden, vocab;
};

struct Inputs {
  torch::Tensor y, h, table, ids, bias;
};

Inputs inputs(const Shape& s, torch::Dtype dtype, uint64_t seed) {
  torch::manual_seed(seed);
  const auto options = torch::TensorOptions().dtype(dtype).device(kCuda);
  Inputs in;
  in.y = torch::randn({s.rows, s.slots, s.rank + 3 * s.message}, options);
  // A state whose readout is zero (its terms, linear in it, too): the scale comes from eps.
  in.y[0][1].zero_();
  in.h = torch::randn({s.rows, s.slots, s.hidden}, options);
  in.table = torch::randn({s.vocab, 2 * s.message}, options);
  in.bias = torch::randn({s.message}, options);
  // Every row's anchor in column 0 of a [rows, 3] tensor: ids read with stride 3.
  in.ids = torch::randint(0, s.vocab, {s.rows, 3}, options.dtype(torch::kLong)).select(1, 0);
  return in;
}

void check(const Shape& s, torch::Dtype dtype, uint64_t seed) {
  const double eps = 1e-24 / static_cast<double>(s.rank);
  const auto in = inputs(s, dtype, seed);
  ASSERT_TRUE(ops::injection_gate_fusable(in.y, in.h, in.table, in.ids, in.bias, s.rank));
  const auto fused = ops::injection_gate_fused(in.y, in.h, in.table, in.ids, in.bias, s.rank, eps);
  const auto f32 = torch::kFloat32;
  const auto ref = ops::injection_gate_reference(in.y.to(f32), in.h.to(f32), in.table.to(f32),
                                                 in.ids, in.bias.to(f32), s.rank, eps);
  ASSERT_EQ(fused.sizes(), ref.sizes());
  EXPECT_TRUE(torch::all(fused.select(1, 0) == 0).item<bool>()) << "slot 0 is not written";
  EXPECT_TRUE(torch::isfinite(fused).all().item<bool>());
  const double error = norm_relative_error(fused, ref);
  const std::string what = std::string(dtype == torch::kBFloat16 ? "bf16" : "fp32") + " T " +
                           std::to_string(s.slots) + " r " + std::to_string(s.rank);
  std::printf("%-24s relative error %.2e, cosine %.8f\n", what.c_str(), error, cosine(fused, ref));
  EXPECT_LT(error, dtype == torch::kFloat32 ? 1e-5 : 1e-2) << what;
  if (dtype != torch::kFloat32) EXPECT_GT(cosine(fused, ref), 0.9999) << what;
}

TEST(InjectionGate, FusedEqualsReference) {
  REQUIRE_CUDA();
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    check({3, 8, 128, 64, 512, 260}, dtype, 1);  // the gpu testbed's draft
    check({2, 2, 32, 16, 96, 50}, dtype, 2);     // one proposal per block
    check({1, 16, 64, 300, 4096, 1000}, dtype, 3);
  }
}

TEST(InjectionGate, RefusesWhatItDoesNotTake) {
  REQUIRE_CUDA();
  const Shape s{2, 8, 32, 16, 64, 50};
  const auto in = inputs(s, torch::kBFloat16, 4);
  EXPECT_FALSE(ops::injection_gate_fusable(in.y.cpu(), in.h.cpu(), in.table.cpu(), in.ids.cpu(),
                                           in.bias.cpu(), s.rank));
  EXPECT_FALSE(ops::injection_gate_fusable(in.y, in.h, in.table, in.ids, in.bias, s.rank + 1));
  EXPECT_FALSE(ops::injection_gate_fusable(in.y.to(torch::kFloat64), in.h, in.table, in.ids,
                                           in.bias, s.rank));
  EXPECT_FALSE(
      ops::injection_gate_fusable(in.y.transpose(0, 1), in.h, in.table, in.ids, in.bias, s.rank));
  EXPECT_THROW(ops::injection_gate_fused(in.y, in.h, in.table.narrow(1, 0, 2 * s.message - 2),
                                         in.ids, in.bias, s.rank, 1e-24),
               std::exception);
}

}  // namespace
}  // namespace dspine
