// A MasterAdamW over a few sharding units of different sizes (context, two layers, head; one
// unit spans more than one 64 Ki-element chunk of the CUDA multi-tensor kernels), stepped with
// gradients the test chooses: the loss is Σ_p <p, g_p>, so each parameter's gradient is exactly
// its g_p. Shared by the CPU (tests/train) and CUDA (tests/gpu) fused-vs-reference tests.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/fresh_dir.h"
#include "common/parity.h"
#include "core/config.h"
#include "core/safetensors.h"
#include "dist/communicator.h"
#include "dist/sharded_parameters.h"
#include "train/optimizer.h"

namespace dspine::testing {

struct AdamWToyImpl : torch::nn::Module {
  AdamWToyImpl() {
    register_module("fc", torch::nn::Linear(torch::nn::LinearOptions(6, 64).bias(false)));
    auto layers = torch::nn::ModuleList();
    layers->push_back(torch::nn::Linear(64, 1100));
    layers->push_back(torch::nn::Linear(1100, 64));
    register_module("layers", layers);
    register_module("lm", torch::nn::Linear(64, 5));
  }
};
TORCH_MODULE(AdamWToy);

// One gradient per parameter (named_parameters order) for each step, scaled to the total norm
// `norms[step]`, on the CPU; the same for every rig.
inline std::vector<std::vector<torch::Tensor>> adamw_gradients(const std::vector<double>& norms) {
  torch::manual_seed(7);
  AdamWToy shapes;
  std::vector<std::vector<torch::Tensor>> steps;
  for (const double norm : norms) {
    std::vector<torch::Tensor> grads;
    double squares = 0;
    for (const auto& p : shapes->parameters()) {
      grads.push_back(torch::randn(p.sizes()));
      squares += grads.back().square().sum().item<double>();
    }
    for (auto& g : grads) g.mul_(norm / std::sqrt(squares));
    steps.push_back(std::move(grads));
  }
  return steps;
}

inline core::TrainingConfig adamw_config() {
  core::TrainingConfig config;
  config.max_grad_norm = 1.0;
  config.weight_decay = 0.1;
  config.adam_eps = 1e-8;
  return config;
}

// A model (same initial weights in every rig), its units (sharding none, one process) and the
// optimizer, fused or reference, on `device`.
struct AdamWRig {
  AdamWRig(bool fused, const torch::Device& device,
           const core::TrainingConfig& config = adamw_config(),
           torch::Dtype dtype = torch::kFloat) {
    torch::manual_seed(3);
    model = AdamWToy();
    model->to(device, dtype);
    sharded = std::make_unique<dist::ShardedParameters>(
        *model, dist::make_single_process_communicator(), core::Sharding::kNone);
    sharded->load_masters_from_model();
    optimizer = std::make_unique<train::MasterAdamW>(*sharded, config, fused);
  }

  // One optimizer step at `lr` on the gradients `grads`; returns the gradient norm it clipped by.
  double step(const std::vector<torch::Tensor>& grads, double lr) {
    sharded->begin_backward(true);
    auto params = model->parameters();
    auto loss = torch::zeros({}, params.front().options());
    for (size_t i = 0; i < params.size(); ++i) {
      loss = loss + (params[i] * grads[i].to(params[i].options())).sum();
    }
    loss.backward();
    const double norm = optimizer->gradient_norm();
    optimizer->step(lr, norm);
    optimizer->zero_grad();
    return norm;
  }

  AdamWToy model{nullptr};
  std::unique_ptr<dist::ShardedParameters> sharded;
  std::unique_ptr<train::MasterAdamW> optimizer;
};

inline const at::Tensor& named(const core::NamedTensors& tensors, const std::string& name) {
  for (const auto& [key, tensor] : tensors) {
    if (key == name) return tensor;
  }
  ADD_FAILURE() << "no tensor " << name;
  static const at::Tensor none;
  return none;
}

// fp32 rounding apart: |a - b| <= rtol (|b| + max|b|), expect_allclose with atol = rtol max|b|.
// The absolute part scales with the tensor (second moments are ~1e-7 here); first moments that
// cancel to ~0 differ by a few ulps of their terms, ~2e-10 against a largest element of ~2e-3.
inline void expect_rounding_close(const at::Tensor& got, const at::Tensor& expected,
                                  const std::string& what, double rtol = 1e-6) {
  ASSERT_EQ(got.sizes(), expected.sizes()) << what;
  const double max_value = expected.abs().max().item<double>();
  expect_allclose(got, expected, rtol, rtol * max_value, what);
}

// ATen's CUDA fused AdamW receives β2 as fp32 and forms 1 − β2 in fp32: for β2 = 0.999 that is
// 1.29e-5 off (1 − β2), relative, which every second moment it writes carries (its CPU kernel
// keeps the double). The tolerance of a CUDA state's second moments adds that offset.
inline double moment_rtol(const std::string& name, const at::Tensor& got) {
  if (!got.is_cuda() || name.rfind("exp_avg_sq.", 0) != 0) return 1e-6;
  const double beta2 = adamw_config().adam_beta2;
  const double in_fp32 = 1.0f - static_cast<float>(beta2);
  return 1e-6 + std::abs(in_fp32 - (1.0 - beta2)) / (1.0 - beta2);
}

// Two optimizer states (state()): the same names, integer entries (step counts) equal, fp32
// entries (masters, moments) within fp32 rounding (expect_rounding_close, moment_rtol).
inline void expect_same_state(const core::NamedTensors& got, const core::NamedTensors& expected,
                              const std::string& what) {
  ASSERT_EQ(got.size(), expected.size()) << what;
  for (const auto& [name, tensor] : expected) {
    if (tensor.is_floating_point()) {
      const auto& mine = named(got, name);
      expect_rounding_close(mine, tensor, what + " " + name, moment_rtol(name, mine));
    } else {
      EXPECT_TRUE(torch::equal(named(got, name).cpu(), tensor.cpu())) << what << " " << name;
    }
  }
}

// Per step: the gradient norms (1 = max_grad_norm: steps 0, 2, 4 are clipped, 1 and 3 not)
// and the learning rates.
const std::vector<double> kAdamWNorms = {3.0, 0.5, 10.0, 0.2, 2.0};
const std::vector<double> kAdamWRates = {1e-3, 2e-3, 5e-4, 1e-3, 3e-3};

// The fused and the reference path over kAdamWNorms / kAdamWRates on `device`: after every step
// the masters, both moments and the step counts agree (expect_same_state). Returns both rigs.
inline std::pair<std::unique_ptr<AdamWRig>, std::unique_ptr<AdamWRig>> expect_fused_as_reference(
    const torch::Device& device) {
  const auto grads = adamw_gradients(kAdamWNorms);
  auto fused = std::make_unique<AdamWRig>(true, device);
  auto reference = std::make_unique<AdamWRig>(false, device);
  for (size_t step = 0; step < grads.size(); ++step) {
    const double norm = fused->step(grads[step], kAdamWRates[step]);
    EXPECT_NEAR(norm, reference->step(grads[step], kAdamWRates[step]), 1e-6 * norm)
        << "step " << step;
    EXPECT_NEAR(norm, kAdamWNorms[step], 1e-4 * kAdamWNorms[step]) << "step " << step;
    const auto state = fused->optimizer->state();
    EXPECT_EQ(named(state, "steps").item<int64_t>(), static_cast<int64_t>(step) + 1);
    EXPECT_EQ(named(state, "step.layers.0").item<int64_t>(), static_cast<int64_t>(step) + 1);
    expect_same_state(state, reference->optimizer->state(), "step " + std::to_string(step));
  }
  return {std::move(fused), std::move(reference)};
}

// A bf16 model in a world of one: nothing reduces its gradient, so the optimizer reads the bf16
// gradient itself (no fp32 copy exists) and both paths step the fp32 masters from it alike; after
// every step the model holds each master rounded to bf16.
inline void expect_bf16_model_steps(const torch::Device& device) {
  const auto grads = adamw_gradients(kAdamWNorms);
  AdamWRig fused(true, device, adamw_config(), torch::kBFloat16);
  AdamWRig reference(false, device, adamw_config(), torch::kBFloat16);
  for (auto* rig : {&fused, &reference}) {
    for (auto& unit : rig->sharded->units()) {
      EXPECT_FALSE(unit.reduces_gradient()) << unit.name();
      EXPECT_EQ(unit.gradient().scalar_type(), torch::kBFloat16) << unit.name();
      EXPECT_EQ(unit.master().scalar_type(), torch::kFloat) << unit.name();
    }
  }
  for (size_t step = 0; step < grads.size(); ++step) {
    const double norm = fused.step(grads[step], kAdamWRates[step]);
    EXPECT_NEAR(norm, reference.step(grads[step], kAdamWRates[step]), 1e-6 * norm)
        << "step " << step;
    expect_same_state(fused.optimizer->state(), reference.optimizer->state(),
                      "bf16 model, step " + std::to_string(step));
    for (auto* rig : {&fused, &reference}) {
      for (auto& unit : rig->sharded->units()) {
        EXPECT_TRUE(torch::equal(unit.whole_weights(), unit.master().to(torch::kBFloat16)))
            << (rig == &fused ? "fused " : "reference ") << unit.name() << " step " << step;
      }
    }
  }
}

// One step from fresh moments, by hand: with c the clip coefficient, g' = c g, m = (1 - β1) g',
// v = (1 - β2) g'², and p ← p (1 - lr wd) - lr g' / (|g'| + eps) (bias corrections cancel).
// A large eps keeps the update proportional to c, so a wrong clip shows.
inline void expect_first_step_by_hand(bool fused, const torch::Device& device) {
  auto config = adamw_config();
  config.adam_eps = 0.5;
  const double lr = 0.01, norm = 4.0, c = 1.0 / (norm + 1e-6);
  const auto grads = adamw_gradients({norm});
  AdamWRig rig(fused, device, config);
  std::vector<torch::Tensor> before;
  for (const auto& p : rig.model->parameters()) {
    before.push_back(p.detach().cpu().to(torch::kDouble));
  }
  rig.step(grads[0], lr);
  // Each unit's flat state is its parameters' in order: context, layers.0, layers.1, head.
  std::vector<torch::Tensor> masters, exp_avgs, exp_avg_sqs;
  for (size_t i = 0; i < before.size(); ++i) {
    const auto g = grads[0][i].to(torch::kDouble) * c;
    masters.push_back(
        (before[i] * (1 - lr * config.weight_decay) - lr * g / (g.abs() + config.adam_eps))
            .flatten());
    exp_avgs.push_back(((1 - config.adam_beta1) * g).flatten());
    exp_avg_sqs.push_back(((1 - config.adam_beta2) * g.square()).flatten());
  }
  const auto state = rig.optimizer->state();
  const auto expect_unit = [&](const std::string& unit, size_t first, size_t count) {
    const auto slice = [&](const std::vector<torch::Tensor>& all) {
      return torch::cat(std::vector<torch::Tensor>(all.begin() + first,
                                                   all.begin() + first + count));
    };
    for (const auto& [key, expected] : {std::pair{"master.", slice(masters)},
                                        std::pair{"exp_avg.", slice(exp_avgs)},
                                        std::pair{"exp_avg_sq.", slice(exp_avg_sqs)}}) {
      expect_rounding_close(named(state, key + unit), expected,
                            (fused ? "fused " : "reference ") + (key + unit),
                            moment_rtol(key + unit, named(state, key + unit)));
    }
    EXPECT_EQ(named(state, "step." + unit).item<int64_t>(), 1);
  };
  // Parameters: fc.weight | layers.0.weight, .bias | layers.1.weight, .bias | lm.weight, .bias.
  expect_unit("context", 0, 1);
  expect_unit("layers.0", 1, 2);
  expect_unit("layers.1", 3, 2);
  expect_unit("head", 5, 2);
}

// `from`'s state() written to a file and read back, as a checkpoint's optimizer shard.
inline core::SafetensorsFile adamw_checkpoint(const AdamWRig& from, const std::string& name) {
  const auto path = (fresh_dir("adamw_" + name) / "optimizer.safetensors").string();
  core::save_safetensors(path, from.optimizer->state());
  return core::load_safetensors(path);
}

// A checkpoint written by one path resumes in the other: the reference path run straight, a
// fused run saved after 3 steps and resumed by the reference (and the reverse) for the last 2,
// and a fused optimizer that already took 4 steps rewound to a step-2 checkpoint, all end in
// the same state.
inline void expect_checkpoints_interchange(const torch::Device& device) {
  const auto grads = adamw_gradients(kAdamWNorms);
  const auto run = [&](AdamWRig& rig, size_t from, size_t to) {
    for (size_t step = from; step < to; ++step) rig.step(grads[step], kAdamWRates[step]);
  };
  AdamWRig straight(false, device);
  run(straight, 0, 2);
  const auto reference_at_2 = adamw_checkpoint(straight, "reference2");
  run(straight, 2, 3);
  const auto reference_at_3 = adamw_checkpoint(straight, "reference3");
  run(straight, 3, 5);
  const auto expected = straight.optimizer->state();

  AdamWRig fused(true, device);
  run(fused, 0, 3);
  AdamWRig reference_resumed(false, device);
  reference_resumed.optimizer->load_state({adamw_checkpoint(fused, "fused3")}, 1);
  run(reference_resumed, 3, 5);
  expect_same_state(reference_resumed.optimizer->state(), expected, "fused -> reference");

  AdamWRig fused_resumed(true, device);
  fused_resumed.optimizer->load_state({reference_at_3}, 1);
  run(fused_resumed, 3, 5);
  expect_same_state(fused_resumed.optimizer->state(), expected, "reference -> fused");

  run(fused, 3, 4);  // then rewound: its next step must count from 2 again
  fused.optimizer->load_state({reference_at_2}, 1);
  run(fused, 2, 5);
  expect_same_state(fused.optimizer->state(), expected, "fused rewound to step 2");
}

}  // namespace dspine::testing
