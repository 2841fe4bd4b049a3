// ops::attention_projections against the composition it replaces (three Linear layers and two
// concatenations): values and every gradient, in fp32 and bf16, with frozen inputs, and the error
// for inputs of the wrong shape.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "ops/attention_projections.h"

namespace dspine::ops {
namespace {

struct Inputs {
  torch::Tensor x, context, wq, wk, wv;
  std::vector<torch::Tensor> all() const { return {x, context, wq, wk, wv}; }
};

// Rows 2, blocks of 6 queries, 5 context positions, H 16, q width 32, k/v width 8.
Inputs make_inputs(torch::Dtype dtype, uint64_t seed) {
  torch::manual_seed(seed);
  auto make = [&](std::vector<int64_t> shape) { return torch::randn(shape).to(dtype); };
  return {make({2, 6, 16}), make({2, 5, 16}), make({32, 16}) * 0.25, make({8, 16}) * 0.25,
          make({8, 16}) * 0.25};
}

Inputs leaves(const Inputs& in, const std::vector<bool>& trainable) {
  std::vector<torch::Tensor> out;
  const auto all = in.all();
  for (size_t i = 0; i < all.size(); ++i) {
    out.push_back(all[i].detach().clone().requires_grad_(trainable[i]));
  }
  return {out[0], out[1], out[2], out[3], out[4]};
}

AttentionProjections composed(const Inputs& in) {
  namespace F = torch::nn::functional;
  return {F::linear(in.x, in.wq),
          torch::cat({F::linear(in.context, in.wk), F::linear(in.x, in.wk)}, 1),
          torch::cat({F::linear(in.context, in.wv), F::linear(in.x, in.wv)}, 1)};
}

// Backpropagates fixed random weights of each output; returns the outputs.
std::vector<torch::Tensor> run(const AttentionProjections& p, uint64_t seed) {
  torch::manual_seed(seed);
  torch::Tensor loss = torch::zeros({}, torch::kFloat);
  for (const auto& out : {p.q, p.k, p.v}) {
    loss = loss + (out.to(torch::kFloat) * torch::randn(out.sizes())).sum();
  }
  loss.backward();
  return {p.q.detach(), p.k.detach(), p.v.detach()};
}

void expect_close(const torch::Tensor& got, const torch::Tensor& want, double rtol,
                  const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double error = (got.to(torch::kDouble) - want.to(torch::kDouble)).norm().item<double>();
  const double scale = want.to(torch::kDouble).norm().item<double>();
  EXPECT_LE(error, rtol * scale) << what << ": relative error " << error / scale;
}

void compare(torch::Dtype dtype, const std::vector<bool>& trainable, double rtol) {
  const Inputs base = make_inputs(dtype, 3);
  const Inputs fused = leaves(base, trainable), reference = leaves(base, trainable);
  const auto got =
      run(attention_projections(fused.x, fused.context, fused.wq, fused.wk, fused.wv), 9);
  const auto want = run(composed(reference), 9);
  const char* names[] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) expect_close(got[i], want[i], rtol, names[i]);
  const char* inputs[] = {"x", "context", "q_weight", "k_weight", "v_weight"};
  const auto f = fused.all(), r = reference.all();
  for (size_t i = 0; i < f.size(); ++i) {
    ASSERT_EQ(f[i].grad().defined(), r[i].grad().defined()) << inputs[i];
    if (r[i].grad().defined()) expect_close(f[i].grad(), r[i].grad(), rtol, inputs[i]);
  }
}

TEST(AttentionProjections, MatchesTheLinearsAndConcatenationsInFp32) {
  compare(torch::kFloat, {true, true, true, true, true}, 1e-6);
}

TEST(AttentionProjections, MatchesInBf16WithinItsRounding) {
  compare(torch::kBFloat16, {true, true, true, true, true}, 1e-2);
}

TEST(AttentionProjections, FrozenInputsGetNoGradient) {
  compare(torch::kFloat, {true, false, false, true, false}, 1e-6);
  compare(torch::kFloat, {false, true, true, false, true}, 1e-6);
}

TEST(AttentionProjections, WrongShapesAreNamed) {
  const Inputs in = make_inputs(torch::kFloat, 1);
  try {
    attention_projections(in.x, in.context.narrow(2, 0, 8), in.wq, in.wk, in.wv);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context [2, 5, 8]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dspine::ops
