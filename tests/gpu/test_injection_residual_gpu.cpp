// The fused injection residual (src/kernels/injection_residual.cu) against its ATen reference:
// fp32 values and gradients to 1e-5 relative; bf16 against the reference evaluated in fp32 on the
// same bf16 inputs by relative error (≤ 1e-2 of the norm) and cosine (≥ 0.9999), as for the other
// bf16 kernels; rows with rms 0; the receiver/predecessor rows (src/kernels/injection_pairs.cu)
// bit for bit against their ATen reference, values and gradients; and the whole adjacent injection
// module, fused against reference.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>

#include "common/parity.h"
#include "common/require_cuda.h"
#include "model/adjacent_injection.h"
#include "ops/injection_pairs_ops.h"
#include "ops/injection_residual_ops.h"

namespace dspine {
namespace {

using testing::cosine;
using testing::norm_relative_error;

const torch::Device kCuda(torch::kCUDA, 0);

struct Result {
  torch::Tensor out, dh, ddelta;
};

Result run(const torch::Tensor& h0, const torch::Tensor& delta0, const torch::Tensor& grad,
           bool skip_first, bool fused) {
  auto h = h0.clone().requires_grad_(true), delta = delta0.clone().requires_grad_(true);
  auto out = fused ? ops::injection_residual_fused(h, delta, skip_first)
                   : ops::injection_residual_reference(h, delta, skip_first);
  out.backward(grad.to(out.scalar_type()));
  return {out.detach(), h.grad(), delta.grad()};
}

struct Shape {
  int64_t rows, blocks, positions, hidden;
};

void check(const Shape& s, torch::Dtype dtype, bool skip_first, uint64_t seed) {
  torch::manual_seed(seed);
  auto options = torch::TensorOptions().dtype(dtype).device(kCuda);
  auto h = torch::randn({s.rows, s.blocks, s.positions, s.hidden}, options);
  h[0][0][1].zero_();  // rms 0: the written slot keeps h and gets no norm gradient
  auto delta = torch::randn(
      {s.rows, s.blocks, skip_first ? s.positions - 1 : s.positions, s.hidden}, options);
  auto grad = torch::randn(h.sizes(), options);
  const auto fused = run(h, delta, grad, skip_first, true);
  // The oracle in fp32 on the same inputs.
  const auto f32 = torch::kFloat32;
  const auto ref = run(h.to(f32), delta.to(f32), grad.to(f32), skip_first, false);
  const std::string what = std::string(dtype == torch::kBFloat16 ? "bf16" : "fp32") +
                           (skip_first ? " skip_first" : "") + " H " + std::to_string(s.hidden);
  const double tolerance = dtype == torch::kFloat32 ? 1e-5 : 1e-2;
  const std::pair<const char*, std::pair<torch::Tensor, torch::Tensor>> pairs[] = {
      {"out", {fused.out, ref.out}},
      {"dh", {fused.dh, ref.dh}},
      {"ddelta", {fused.ddelta, ref.ddelta}}};
  for (const auto& [name, tensors] : pairs) {
    EXPECT_LE(norm_relative_error(tensors.first, tensors.second), tolerance) << what << " " << name;
    EXPECT_GE(cosine(tensors.first, tensors.second), 0.9999) << what << " " << name;
  }
  if (skip_first) {  // slot 0 passes through exactly, value and gradient
    EXPECT_TRUE(torch::equal(fused.out.select(2, 0), h.select(2, 0))) << what;
    EXPECT_TRUE(torch::equal(fused.dh.select(2, 0), grad.select(2, 0))) << what;
  }
  EXPECT_TRUE(torch::equal(fused.out[0][0][1], h[0][0][1])) << what << ": rms 0 row";
}

TEST(InjectionResidualGpu, MatchesReferenceInFp32) {
  REQUIRE_CUDA();
  for (bool skip_first : {true, false}) {
    check({2, 3, 16, 4096}, torch::kFloat32, skip_first, 1);
    check({1, 5, 4, 72}, torch::kFloat32, skip_first, 2);  // a row of 18 packs
  }
}

TEST(InjectionResidualGpu, MatchesReferenceInBf16) {
  REQUIRE_CUDA();
  for (bool skip_first : {true, false}) {
    check({2, 64, 16, 4096}, torch::kBFloat16, skip_first, 3);
    check({3, 7, 5, 200}, torch::kBFloat16, skip_first, 4);  // 25 packs, T not a power of two
  }
}

// Copies and two-term sums rounded once: the fused pairs equal ATen's slices, concatenation and
// gradient accumulation bit for bit, with either output's gradient absent too.
TEST(InjectionPairsGpu, EqualTheReferenceBitForBit) {
  REQUIRE_CUDA();
  torch::manual_seed(6);
  struct PairShape {
    int64_t rows, blocks, positions, rank;
  };
  for (const torch::Dtype dtype : {torch::kBFloat16, torch::kFloat32}) {
    for (const PairShape s :
         {PairShape{2, 64, 16, 1024}, PairShape{3, 7, 5, 200}, PairShape{1, 5, 2, 8}}) {
      for (int used = 0; used < 3; ++used) {  // both outputs, the receiver only, the predecessor
        const auto options = torch::TensorOptions().dtype(dtype).device(kCuda);
        const auto features0 = torch::randn({s.rows, s.blocks, s.positions, s.rank}, options);
        const auto anchor0 = torch::randn({s.rows, s.blocks, 1, s.rank}, options);
        const auto grad_r = torch::randn({s.rows, s.blocks, s.positions - 1, s.rank}, options);
        const auto grad_p = torch::randn_like(grad_r);
        std::vector<torch::Tensor> results[2];
        for (const bool fused : {false, true}) {
          auto features = features0.clone().requires_grad_(true);
          auto anchor = anchor0.clone().requires_grad_(true);
          ASSERT_TRUE(ops::injection_pairs_fusable(features, anchor));
          auto [receiver, predecessor] = fused ? ops::injection_pairs_fused(features, anchor)
                                               : ops::injection_pairs_reference(features, anchor);
          auto loss = torch::zeros({}, options.dtype(torch::kFloat32));
          if (used != 2) loss = loss + (receiver.to(torch::kFloat32) * grad_r).sum();
          if (used != 1) loss = loss + (predecessor.to(torch::kFloat32) * grad_p).sum();
          loss.backward();
          const auto grad_anchor =
              anchor.grad().defined() ? anchor.grad() : torch::zeros_like(anchor);
          results[fused] = {receiver.detach(), predecessor.detach(), features.grad(), grad_anchor};
        }
        const std::string what = std::string(c10::toString(dtype)) + " rank " +
                                 std::to_string(s.rank) + " T " + std::to_string(s.positions) +
                                 " outputs used " + std::to_string(used);
        const char* names[] = {"receiver", "predecessor", "dfeatures", "danchor"};
        for (int i = 0; i < 4; ++i) {
          EXPECT_TRUE(torch::equal(results[1][i], results[0][i])) << what << " " << names[i];
        }
      }
    }
  }
}

// The write with its readout (ops::injection_residual_readout_fused) against the ATen reference,
// as `check` does for the write alone, with the readout's gradient present, absent, or alone.
TEST(InjectionResidualGpu, ReadoutOfTheWriteMatchesReference) {
  REQUIRE_CUDA();
  torch::manual_seed(7);
  for (const torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (int used = 0; used < 3; ++used) {  // both outputs, the write only, the readout only
      const auto options = torch::TensorOptions().dtype(dtype).device(kCuda);
      const int64_t rows = 2, blocks = 9, positions = 16, hidden = 4096, rank = 1024;
      const auto h0 = torch::randn({rows, blocks, positions, hidden}, options);
      const auto delta0 = torch::randn({rows, blocks, positions - 1, hidden}, options);
      const auto r0 = torch::randn({rows, blocks, positions, rank}, options);
      const auto delta_r0 = torch::randn({rows, blocks, positions - 1, rank}, options);
      const auto grad = torch::randn(h0.sizes(), options.dtype(torch::kFloat32));
      const auto grad_r = torch::randn(r0.sizes(), options.dtype(torch::kFloat32));
      auto run_op = [&](bool fused, torch::Dtype as) {
        std::vector<torch::Tensor> inputs;
        for (const auto& t : {h0, delta0, r0, delta_r0}) {
          inputs.push_back(t.to(as).clone().requires_grad_(true));  // fresh leaves
        }
        auto [out, out_r] = fused ? ops::injection_residual_readout_fused(
                                        inputs[0], inputs[1], inputs[2], inputs[3], true)
                                  : ops::injection_residual_readout_reference(
                                        inputs[0], inputs[1], inputs[2], inputs[3], true);
        auto loss = torch::zeros({}, options.dtype(torch::kFloat32));
        if (used != 2) loss = loss + (out.to(torch::kFloat32) * grad).sum();
        if (used != 1) loss = loss + (out_r.to(torch::kFloat32) * grad_r).sum();
        loss.backward();
        std::vector<torch::Tensor> results{out.detach(), out_r.detach()};
        for (auto& t : inputs) {
          results.push_back(t.grad().defined() ? t.grad() : torch::zeros_like(t));
        }
        return results;
      };
      ASSERT_TRUE(ops::injection_residual_readout_fusable(h0, delta0, r0, delta_r0, true));
      const auto fused = run_op(true, dtype);
      const auto ref = run_op(false, torch::kFloat32);  // the oracle in fp32 on the same inputs
      const double tolerance = dtype == torch::kFloat32 ? 1e-5 : 1e-2;
      const char* names[] = {"out", "out_r", "dh", "ddelta", "dr", "ddelta_r"};
      for (int i = 0; i < 6; ++i) {
        const std::string what = std::string(c10::toString(dtype)) + " outputs used " +
                                 std::to_string(used) + " " + names[i];
        if (ref[i].abs().max().item<double>() == 0.0) {
          EXPECT_EQ(fused[i].abs().max().item<double>(), 0.0) << what;
          continue;
        }
        EXPECT_LE(norm_relative_error(fused[i], ref[i]), tolerance) << what;
        EXPECT_GE(cosine(fused[i], ref[i]), 0.9999) << what;
      }
      // Slot 0 of the readout passes through unchanged.
      EXPECT_TRUE(torch::equal(fused[1].select(2, 0), r0.select(2, 0))) << c10::toString(dtype);
    }
  }
}

TEST(InjectionResidualGpu, FusedModuleMatchesReferenceModule) {
  REQUIRE_CUDA();
  const int64_t hidden = 256, rank = 64, message = 32, layers = 2, positions = 8;
  torch::manual_seed(5);
  model::AdjacentInjection reference(hidden, rank, message, layers, 1, false);
  model::AdjacentInjection fused(hidden, rank, message, layers, 1, true);
  {
    torch::NoGradGuard no_grad;
    // Non-zero writes and predecessor gate, so every path carries gradient.
    for (auto& p : reference->parameters()) p.normal_(0.0, 0.05);
    auto source = reference->parameters();
    auto target = fused->parameters();
    for (size_t i = 0; i < source.size(); ++i) target[i].copy_(source[i]);
  }
  model::AdjacentInjection oracle(hidden, rank, message, layers, 1, false);
  {
    torch::NoGradGuard no_grad;
    auto source = reference->parameters();
    auto target = oracle->parameters();
    for (size_t i = 0; i < source.size(); ++i) target[i].copy_(source[i]);
  }
  reference->to(kCuda, torch::kBFloat16);
  fused->to(kCuda, torch::kBFloat16);
  oracle->to(kCuda, torch::kFloat32);
  auto options = torch::TensorOptions().dtype(torch::kBFloat16).device(kCuda);
  auto h = torch::randn({2, 6, positions, hidden}, options);
  auto tokens = torch::randint(0, 100, {2, 6, positions}, options.dtype(torch::kInt64));
  auto codes = torch::randn({100, rank}, options);
  auto replace = torch::rand({2, 6}, options.dtype(torch::kFloat32)) < 0.5;
  // Random projections of the written state and of its feature (Σ feature² would be constant,
  // its gradient pure rounding noise); the fused module reads the feature through the messages.
  auto grad = torch::randn(h.sizes(), options.dtype(torch::kFloat32));
  auto feature_grad = torch::randn({2, 6, positions, rank}, options.dtype(torch::kFloat32));
  auto run_module = [&](model::AdjacentInjection& module, torch::Dtype dtype) {
    auto x = h.to(dtype).requires_grad_(true);
    auto [y, features] = module->forward(x, 0, tokens, codes.to(dtype), replace, true);
    ((y.to(torch::kFloat32) * grad).sum() + (features.to(torch::kFloat32) * feature_grad).sum())
        .backward();
    std::vector<torch::Tensor> grads{x.grad()};
    for (auto& p : module->parameters()) {
      grads.push_back(p.grad().defined() ? p.grad() : torch::zeros_like(p));
    }
    return std::make_pair(y.detach(), grads);
  };
  auto [out_oracle, grads_oracle] = run_module(oracle, torch::kFloat32);
  auto [out_ref, grads_ref] = run_module(reference, torch::kBFloat16);
  auto [out_fused, grads_fused] = run_module(fused, torch::kBFloat16);
  EXPECT_LE(norm_relative_error(out_fused, out_oracle), 1e-2);
  // Each gradient of the fused bf16 module is as close to the fp32 oracle as the reference bf16
  // module's is (gradients summed over many rows lose digits to bf16 in either path).
  for (size_t i = 0; i < grads_oracle.size(); ++i) {
    if (grads_oracle[i].abs().max().item<double>() == 0.0) {
      EXPECT_EQ(grads_fused[i].abs().max().item<double>(), 0.0) << "gradient " << i;
      continue;
    }
    const double floor = cosine(grads_ref[i], grads_oracle[i]);
    EXPECT_GE(cosine(grads_fused[i], grads_oracle[i]), std::min(0.9999, floor - 1e-3))
        << "gradient " << i << ", reference bf16 cosine " << floor;
    EXPECT_LE(norm_relative_error(grads_fused[i], grads_oracle[i]),
              std::max(1e-2, 1.5 * norm_relative_error(grads_ref[i], grads_oracle[i])))
        << "gradient " << i;
  }
}

}  // namespace
}  // namespace dspine
