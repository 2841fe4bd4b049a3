// How gradients reach a sharding unit's flat buffer (dist/sharded_unit.h): zero_grad leaves .grad
// undefined, the first gradient of each parameter after it is copied into the buffer, later ones
// add to it, and parameters that got none read zeros, not the previous window's values.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dist/sharded_parameters.h"

namespace dspine::dist {
namespace {

// Two units: "context" (fc.weight) and "layers.0" (a and b; b only used when asked).
struct TwoUnits : torch::nn::Module {
  TwoUnits() {
    fc = register_module("fc", torch::nn::Linear(torch::nn::LinearOptions(3, 3).bias(false)));
    layers = register_module("layers", torch::nn::ModuleList());
    auto layer = std::make_shared<torch::nn::Module>();
    a = layer->register_parameter("a", torch::randn({3, 2}));
    b = layer->register_parameter("b", torch::randn({2}));
    layers->push_back(layer);
  }
  torch::Tensor loss(const torch::Tensor& x, bool use_b) {
    auto y = fc(x).matmul(a);
    if (use_b) y = y * b;
    return y.square().sum();
  }
  torch::nn::Linear fc{nullptr};
  torch::nn::ModuleList layers{nullptr};
  torch::Tensor a, b;
};

// The gradients of one loss, computed on a detached copy of the module's weights.
std::vector<torch::Tensor> expected_gradients(TwoUnits& model, const torch::Tensor& x, bool use_b) {
  auto fc = model.fc->weight.detach().clone().requires_grad_();
  auto a = model.a.detach().clone().requires_grad_();
  auto b = model.b.detach().clone().requires_grad_();
  auto y = x.matmul(fc.t()).matmul(a);
  if (use_b) y = y * b;
  y.square().sum().backward();
  return {fc.grad(), a.grad(), b.grad().defined() ? b.grad() : torch::zeros_like(b)};
}

void backward(ShardedParameters& sharded, TwoUnits& model, const torch::Tensor& x, bool use_b,
              bool last) {
  sharded.begin_backward(last);
  model.loss(x, use_b).backward();
}

// unit.gradient() of both units, as [fc.weight, a, b].
std::vector<torch::Tensor> unit_gradients(ShardedParameters& sharded) {
  sharded.finish_gradient_sync();
  const auto& units = sharded.units();
  const auto& context = units.at(0).gradient();
  const auto& layer = units.at(1).gradient();
  return {context.narrow(0, 0, 9).view({3, 3}), layer.narrow(0, 0, 6).view({3, 2}),
          layer.narrow(0, 6, 2)};
}

TEST(ShardedGradients, FirstGradientAfterZeroGradIsCopiedAndLaterOnesAdd) {
  torch::manual_seed(0);
  TwoUnits model;
  ShardedParameters sharded(model, make_single_process_communicator(), core::Sharding::kNone);
  const auto x1 = torch::randn({4, 3}), x2 = torch::randn({5, 3});
  backward(sharded, model, torch::randn({4, 3}), true, true);  // a window before: stale values
  sharded.zero_grad();
  EXPECT_FALSE(model.a.grad().defined());

  backward(sharded, model, x1, true, false);
  backward(sharded, model, x2, true, true);
  const auto first = expected_gradients(model, x1, true);
  const auto second = expected_gradients(model, x2, true);
  const auto got = unit_gradients(sharded);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got[i], first[i] + second[i], 1e-6, 1e-6)) << "parameter " << i;
  }
  // .grad views the flat buffer again: what the optimizer reads is what .grad holds.
  EXPECT_TRUE(torch::equal(model.a.grad(), got[1]));
  EXPECT_EQ(model.a.grad().data_ptr(), sharded.units().at(1).gradient().data_ptr());
}

TEST(ShardedGradients, ParameterWithoutGradientReadsZerosNotThePreviousWindow) {
  torch::manual_seed(1);
  TwoUnits model;
  ShardedParameters sharded(model, make_single_process_communicator(), core::Sharding::kNone);
  backward(sharded, model, torch::randn({4, 3}), true, true);
  ASSERT_GT(unit_gradients(sharded)[2].abs().sum().item<double>(), 0);
  sharded.zero_grad();

  const auto x = torch::randn({4, 3});
  backward(sharded, model, x, false, true);  // b takes no part: its hook never runs
  const auto expected = expected_gradients(model, x, false);
  const auto got = unit_gradients(sharded);
  EXPECT_TRUE(torch::allclose(got[1], expected[1], 1e-6, 1e-6));
  EXPECT_TRUE(torch::equal(got[2], torch::zeros({2})));
  EXPECT_TRUE(torch::equal(model.b.grad(), torch::zeros({2})));
}

}  // namespace
}  // namespace dspine::dist
