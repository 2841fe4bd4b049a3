// Fused RMSNorm / add+RMSNorm / SwiGLU against their ATen references on CUDA: values and every
// gradient on awkward shapes (odd hidden sizes, one row, many rows, strided halves), fp32 to
// 1e-5 and bf16 to 1e-2 relative error of the norm; deterministic dW; checkpoints interchangeable.
#include <gtest/gtest.h>
#include <ATen/cuda/CUDAContext.h>
#include <torch/torch.h>

#include <filesystem>
#include <vector>

#include "common/parity.h"
#include "common/require_cuda.h"
#include "core/safetensors.h"
#include "kernels/swiglu.h"
#include "model/norm_mlp.h"
#include "ops/rms_norm_ops.h"
#include "ops/swiglu_ops.h"

namespace dspine {
namespace {

const torch::Device kCuda(torch::kCUDA, 0);

struct Shape {
  int64_t rows;
  int64_t hidden;
};

// Shapes with tails for every vector width, one row, many rows, and each RMSNorm path: a warp per
// row, a block per row in registers, and the two-pass kernels for rows too long for registers.
const std::vector<Shape> kNormShapes = {{1, 123},   {7, 4095},  {4096, 64},  {3, 4096},
                                        {257, 130}, {16, 8192}, {2048, 123}, {5, 16384},
                                        {33, 1},    {9, 1000},  {3, 65537},  {2, 131072}};

// fp32 results are checked elementwise at 1e-5 (of the reference's scale, at least 1) against an
// fp64 evaluation of the reference; bf16 results by the relative error of the whole tensor against
// the fp32 reference.
void expect_matches(const torch::Tensor& actual, const torch::Tensor& expected, torch::Dtype dtype,
                    const std::string& what) {
  if (dtype == torch::kFloat32) {
    testing::expect_close(actual, expected, 1e-5, what);
  } else {
    ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
    EXPECT_LE(testing::norm_relative_error(actual, expected), 1e-2) << what;
  }
}

torch::Dtype reference_dtype(torch::Dtype dtype) {
  return dtype == torch::kFloat32 ? torch::kFloat64 : torch::kFloat32;
}

// Leaf copies of `inputs` in `dtype` on `device`, requiring grad.
std::vector<torch::Tensor> leaves(const std::vector<torch::Tensor>& inputs, torch::Dtype dtype,
                                  torch::Device device) {
  std::vector<torch::Tensor> out;
  for (const auto& t : inputs) out.push_back(t.to(device, dtype).detach().requires_grad_(true));
  return out;
}

// The reference runs in a wider type on the same values the fused path sees: inputs (and
// upstream gradients) rounded to `dtype` first. Rounding them only for the fused path measured
// the conditioning of the op, not the kernels: add+RMSNorm with hidden = 1 and x ≈ −residual
// amplified bf16 input rounding into a 13% difference.
torch::Tensor as_reference(const torch::Tensor& t, torch::Dtype dtype) {
  return t.to(kCuda, dtype).to(reference_dtype(dtype));
}

std::vector<torch::Tensor> reference_leaves(const std::vector<torch::Tensor>& inputs,
                                            torch::Dtype dtype) {
  std::vector<torch::Tensor> rounded;
  for (const auto& t : inputs) rounded.push_back(as_reference(t, dtype));
  return leaves(rounded, reference_dtype(dtype), kCuda);
}

std::string label(const char* kernel, Shape s, torch::Dtype dtype) {
  return std::string(kernel) + " rows=" + std::to_string(s.rows) +
         " hidden=" + std::to_string(s.hidden) + " " + c10::toString(dtype);
}

class FusedNorm : public ::testing::TestWithParam<torch::Dtype> {};

TEST_P(FusedNorm, RMSNormForwardAndGradientsMatchReference) {
  REQUIRE_CUDA();
  const torch::Dtype dtype = GetParam();
  torch::manual_seed(0);
  for (const Shape s : kNormShapes) {
    const auto x = torch::randn({s.rows, s.hidden}) * 3;
    const auto w = torch::rand({s.hidden}) + 0.5;
    const auto dy = torch::randn({s.rows, s.hidden});
    auto fused = leaves({x, w}, dtype, kCuda);
    auto ref = reference_leaves({x, w}, dtype);
    const auto y = ops::rms_norm_fused(fused[0], fused[1], 1e-6);
    const auto y_ref = ops::rms_norm_reference(ref[0], ref[1], 1e-6);
    y.backward(dy.to(kCuda, dtype));
    y_ref.backward(as_reference(dy, dtype));
    const std::string what = label("rms_norm", s, dtype);
    expect_matches(y, y_ref, dtype, what + " y");
    expect_matches(fused[0].grad(), ref[0].grad(), dtype, what + " dx");
    expect_matches(fused[1].grad(), ref[1].grad(), dtype, what + " dweight");
  }
}

TEST_P(FusedNorm, AddRMSNormForwardAndGradientsMatchReference) {
  REQUIRE_CUDA();
  const torch::Dtype dtype = GetParam();
  torch::manual_seed(1);
  for (const Shape s : kNormShapes) {
    const auto x = torch::randn({s.rows, s.hidden});
    const auto r = torch::randn({s.rows, s.hidden});
    const auto w = torch::rand({s.hidden}) + 0.5;
    const auto dsum = torch::randn({s.rows, s.hidden});
    const auto dy = torch::randn({s.rows, s.hidden});
    auto fused = leaves({x, r, w}, dtype, kCuda);
    auto ref = reference_leaves({x, r, w}, dtype);
    auto [sum, y] = ops::add_rms_norm_fused(fused[0], fused[1], fused[2], 1e-6);
    auto [sum_ref, y_ref] = ops::add_rms_norm_reference(ref[0], ref[1], ref[2], 1e-6);
    if (dtype != torch::kFloat32) {
      // A bf16 layer rounds the sum to bf16 before the norm (so do the kernels); the fp32
      // reference must too, or ill-conditioned rows (hidden = 1: d/ds s/sqrt(s^2 + eps)) differ
      // by far more than bf16 rounding. Rounding passes the gradient through unchanged.
      sum_ref = sum_ref + (sum_ref.to(dtype).to(sum_ref.scalar_type()) - sum_ref).detach();
      y_ref = ops::rms_norm_reference(sum_ref, ref[2], 1e-6);
    }
    torch::autograd::backward({sum, y}, {dsum.to(kCuda, dtype), dy.to(kCuda, dtype)});
    torch::autograd::backward({sum_ref, y_ref}, {as_reference(dsum, dtype), as_reference(dy, dtype)});
    const std::string what = label("add_rms_norm", s, dtype);
    expect_matches(sum, sum_ref, dtype, what + " sum");
    expect_matches(y, y_ref, dtype, what + " y");
    expect_matches(fused[0].grad(), ref[0].grad(), dtype, what + " dx");
    expect_matches(fused[1].grad(), ref[1].grad(), dtype, what + " dresidual");
    expect_matches(fused[2].grad(), ref[2].grad(), dtype, what + " dweight");
  }
}

// x used as a residual and normed, one node: its gradient is the residual's plus the norm's, as
// autograd sums them around the reference; the first output is x's own values.
TEST_P(FusedNorm, RMSNormWithResidualGradientMatchesReference) {
  REQUIRE_CUDA();
  const torch::Dtype dtype = GetParam();
  torch::manual_seed(4);
  for (const Shape s : kNormShapes) {
    const auto x = torch::randn({s.rows, s.hidden}) * 3;
    const auto w = torch::rand({s.hidden}) + 0.5;
    const auto dpassed = torch::randn({s.rows, s.hidden});
    const auto dy = torch::randn({s.rows, s.hidden});
    auto fused = leaves({x, w}, dtype, kCuda);
    auto ref = reference_leaves({x, w}, dtype);
    auto [passed, y] = ops::rms_norm_residual_fused(fused[0], fused[1], 1e-6);
    const auto y_ref = ops::rms_norm_reference(ref[0], ref[1], 1e-6);
    const std::string what = label("rms_norm_residual", s, dtype);
    EXPECT_TRUE(torch::equal(passed, fused[0])) << what;
    torch::autograd::backward({passed, y}, {dpassed.to(kCuda, dtype), dy.to(kCuda, dtype)});
    torch::autograd::backward({ref[0], y_ref},
                              {as_reference(dpassed, dtype), as_reference(dy, dtype)});
    expect_matches(y, y_ref, dtype, what + " y");
    expect_matches(fused[0].grad(), ref[0].grad(), dtype, what + " dx");
    expect_matches(fused[1].grad(), ref[1].grad(), dtype, what + " dweight");
  }
}

TEST_P(FusedNorm, SwiGLUForwardAndGradientsMatchReference) {
  REQUIRE_CUDA();
  const torch::Dtype dtype = GetParam();
  torch::manual_seed(2);
  for (const Shape s : kNormShapes) {
    const auto g = torch::randn({s.rows, s.hidden}) * 3;
    const auto u = torch::randn({s.rows, s.hidden});
    const auto dout = torch::randn({s.rows, s.hidden});
    auto fused = leaves({g, u}, dtype, kCuda);
    auto ref = reference_leaves({g, u}, dtype);
    const auto out = ops::swiglu_fused(fused[0], fused[1]);
    const auto out_ref = ops::swiglu_reference(ref[0], ref[1]);
    out.backward(dout.to(kCuda, dtype));
    out_ref.backward(as_reference(dout, dtype));
    const std::string what = label("swiglu", s, dtype);
    expect_matches(out, out_ref, dtype, what + " out");
    expect_matches(fused[0].grad(), ref[0].grad(), dtype, what + " dgate");
    expect_matches(fused[1].grad(), ref[1].grad(), dtype, what + " dup");
  }
}

// gate and up as the two halves of one projection output: strided rows, odd I (unaligned halves).
TEST_P(FusedNorm, PackedSwiGLUMatchesReferenceOnBothHalves) {
  REQUIRE_CUDA();
  const torch::Dtype dtype = GetParam();
  torch::manual_seed(3);
  for (const Shape s : kNormShapes) {
    const auto gu = torch::randn({2, s.rows, 2 * s.hidden}) * 2;
    const auto dout = torch::randn({2, s.rows, s.hidden});
    auto fused = leaves({gu}, dtype, kCuda);
    auto ref = reference_leaves({gu}, dtype);
    const auto out = ops::swiglu_packed_fused(fused[0]);
    const auto halves = ref[0].chunk(2, -1);
    const auto out_ref = ops::swiglu_reference(halves[0], halves[1]);
    out.backward(dout.to(kCuda, dtype));
    out_ref.backward(as_reference(dout, dtype));
    const std::string what = label("swiglu_packed", s, dtype);
    expect_matches(out, out_ref, dtype, what + " out");
    expect_matches(fused[0].grad(), ref[0].grad(), dtype, what + " dgate_up");
  }
}

// The activation and the down projection as one node (the activation recomputed in the
// backward), without and with the layer's residual (added in the project's GEMM in bf16 where it
// takes I, else after at::mm): output, d(gate_up), d(weight) and d(residual) against the packed
// SwiGLU, a linear layer and the add.
TEST_P(FusedNorm, SwiGLUDownMatchesSwiGLUThenLinear) {
  REQUIRE_CUDA();
  const torch::Dtype dtype = GetParam();
  torch::manual_seed(7);
  for (const bool with_residual : {false, true}) {
    for (const Shape s : {Shape{1, 123}, Shape{17, 200}, Shape{2048, 64}, Shape{5, 1000}}) {
      const int64_t hidden = 96;
      const auto gu = torch::randn({2, s.rows, 2 * s.hidden}) * 2;
      const auto w = torch::randn({hidden, s.hidden}) / std::sqrt(static_cast<double>(s.hidden));
      const auto r = torch::randn({2, s.rows, hidden}), dout = torch::randn({2, s.rows, hidden});
      auto fused = leaves({gu, w, r}, dtype, kCuda);
      auto ref = reference_leaves({gu, w, r}, dtype);
      const auto residual = with_residual ? fused[2] : torch::Tensor();
      ASSERT_TRUE(ops::swiglu_down_fusable(fused[0], fused[1], residual));
      const auto out = ops::swiglu_down_fused(fused[0], fused[1], residual);
      const auto halves = ref[0].chunk(2, -1);
      auto out_ref =
          torch::nn::functional::linear(ops::swiglu_reference(halves[0], halves[1]), ref[1]);
      if (with_residual) out_ref = out_ref + ref[2];
      out.backward(dout.to(kCuda, dtype));
      out_ref.backward(as_reference(dout, dtype));
      const std::string what =
          label(with_residual ? "swiglu_down + residual" : "swiglu_down", s, dtype);
      expect_matches(out, out_ref, dtype, what + " out");
      expect_matches(fused[0].grad(), ref[0].grad(), dtype, what + " dgate_up");
      expect_matches(fused[1].grad(), ref[1].grad(), dtype, what + " dweight");
      if (with_residual) expect_matches(fused[2].grad(), ref[2].grad(), dtype, what + " dresidual");
    }
  }
}

// The whole MLP with its residual as one node (the project's GEMM, bf16 only): output and every
// gradient against linear layers, the SwiGLU and the add in fp32.
TEST(FusedNormModules, SwiGLUMLPNodeMatchesTheLayers) {
  REQUIRE_CUDA();
  if (at::cuda::getCurrentDeviceProperties()->major != 9) GTEST_SKIP() << "needs sm_90";
  torch::manual_seed(10);
  const torch::Dtype dtype = torch::kBFloat16;
  for (const Shape s : {Shape{1, 64}, Shape{300, 1000}, Shape{2048, 512}}) {
    const int64_t hidden = 136;
    const auto x = torch::randn({2, s.rows, hidden});
    const auto wgu = torch::randn({2 * s.hidden, hidden}) / std::sqrt(double(hidden));
    const auto wd = torch::randn({hidden, s.hidden}) / std::sqrt(double(s.hidden));
    const auto r = torch::randn({2, s.rows, hidden}), dout = torch::randn({2, s.rows, hidden});
    auto fused = leaves({x, wgu, wd, r}, dtype, kCuda);
    auto ref = reference_leaves({x, wgu, wd, r}, dtype);
    ASSERT_TRUE(ops::swiglu_mlp_fusable(fused[0], fused[1], fused[2], fused[3]));
    const auto out = ops::swiglu_mlp_fused(fused[0], fused[1], fused[2], fused[3]);
    const auto halves = torch::nn::functional::linear(ref[0], ref[1]).chunk(2, -1);
    const auto out_ref =
        torch::nn::functional::linear(ops::swiglu_reference(halves[0], halves[1]), ref[2]) + ref[3];
    out.backward(dout.to(kCuda, dtype));
    out_ref.backward(as_reference(dout, dtype));
    const std::string what = label("swiglu_mlp", s, dtype);
    expect_matches(out, out_ref, dtype, what + " out");
    const char* names[] = {" dx", " dgate_up_weight", " ddown_weight", " dresidual"};
    for (int i = 0; i < 4; ++i)
      expect_matches(fused[i].grad(), ref[i].grad(), dtype, what + names[i]);
  }
}

// The backward that recomputes the activation writes the forward's activation bit for bit, and
// the same d(gate) and d(up) as the plain backward, over the gradient it read.
TEST_P(FusedNorm, RecomputedActivationIsTheForwardsBitForBit) {
  REQUIRE_CUDA();
  const torch::Dtype dtype = GetParam();
  torch::manual_seed(8);
  const auto opts = torch::TensorOptions(kCuda).dtype(dtype);
  for (const Shape s : {Shape{3, 123}, Shape{4096, 1024}}) {
    const auto gu = torch::randn({s.rows, 2 * s.hidden}, opts) * 3;
    const auto gate = gu.narrow(1, 0, s.hidden), up = gu.narrow(1, s.hidden, s.hidden);
    const auto dout = torch::randn({s.rows, s.hidden}, opts);
    const kernels::DType kd =
        dtype == torch::kFloat32 ? kernels::DType::kFloat32 : kernels::DType::kBFloat16;
    const kernels::Strided2d shape{s.rows, s.hidden};
    const auto stream = at::cuda::getCurrentCUDAStream();
    auto act = torch::empty({s.rows, s.hidden}, opts);
    auto dgate = torch::empty_like(act), dup = torch::empty_like(act);
    auto dgate2 = torch::empty_like(act), dup2 = torch::empty_like(act);
    auto dout_act = dout.clone();
    ASSERT_EQ(kernels::swiglu_forward(gate.data_ptr(), gu.stride(0), up.data_ptr(), gu.stride(0),
                                      act.data_ptr(), s.hidden, shape, kd, stream),
              cudaSuccess);
    ASSERT_EQ(kernels::swiglu_backward(dout.data_ptr(), s.hidden, gate.data_ptr(), gu.stride(0),
                                       up.data_ptr(), gu.stride(0), dgate.data_ptr(), s.hidden,
                                       dup.data_ptr(), s.hidden, shape, kd, stream),
              cudaSuccess);
    ASSERT_EQ(kernels::swiglu_backward_recompute(
                  dout_act.data_ptr(), s.hidden, gate.data_ptr(), gu.stride(0), up.data_ptr(),
                  gu.stride(0), dgate2.data_ptr(), s.hidden, dup2.data_ptr(), s.hidden, shape, kd,
                  stream),
              cudaSuccess);
    const std::string what = label("swiglu_backward_recompute", s, dtype);
    EXPECT_TRUE(torch::equal(dout_act, act)) << what << " activation";
    EXPECT_TRUE(torch::equal(dgate2, dgate)) << what << " dgate";
    EXPECT_TRUE(torch::equal(dup2, dup)) << what << " dup";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FusedNorm, ::testing::Values(torch::kFloat32, torch::kBFloat16),
                         [](const auto& info) {
                           return info.param == torch::kFloat32 ? std::string("fp32")
                                                                : std::string("bf16");
                         });

TEST(FusedNormDeterminism, RMSNormWeightGradientIsBitwiseRepeatable) {
  REQUIRE_CUDA();
  torch::manual_seed(4);
  const auto x = torch::randn({16384, 1024}, torch::TensorOptions(kCuda).dtype(torch::kBFloat16));
  const auto dy = torch::randn_like(x);
  std::vector<torch::Tensor> grads;
  for (int run = 0; run < 3; ++run) {
    auto w = torch::ones({1024}, x.options()).requires_grad_(true);
    ops::rms_norm_fused(x, w, 1e-6).backward(dy);
    grads.push_back(w.grad());
  }
  EXPECT_TRUE(torch::equal(grads[0], grads[1]));
  EXPECT_TRUE(torch::equal(grads[0], grads[2]));
}

TEST(FusedNormModules, SwiGLUMLPFusedMatchesReferenceIncludingWeightGradients) {
  REQUIRE_CUDA();
  torch::manual_seed(5);
  model::SwiGLUMLP reference(96, 200, false), fused(96, 200, true);
  fused->to(kCuda);
  reference->to(kCuda);
  {
    torch::NoGradGuard no_grad;
    for (auto& item : reference->named_parameters()) {
      item.value().copy_(fused->named_parameters()[item.key()]);
    }
  }
  const auto x = torch::randn({3, 17, 96}, kCuda);
  const auto dy = torch::randn({3, 17, 96}, kCuda);
  const auto y = fused(x);
  const auto y_ref = reference(x);
  y.backward(dy);
  y_ref.backward(dy);
  EXPECT_LE(testing::max_abs_diff(y, y_ref), 1e-5);
  for (const auto& name : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}) {
    const auto g = fused->named_parameters()[name].grad();
    const auto g_ref = reference->named_parameters()[name].grad();
    EXPECT_LE(testing::max_abs_diff(g, g_ref), 1e-5) << name;
  }
}

TEST(FusedNormModules, CheckpointsLoadAcrossFusedAndReferenceModules) {
  REQUIRE_CUDA();
  torch::manual_seed(6);
  model::RMSNorm norm_fused(64, 1e-6, true);
  model::SwiGLUMLP mlp_fused(64, 160, true);
  {
    torch::NoGradGuard no_grad;
    norm_fused->weight.uniform_(0.5, 1.5);
  }
  core::NamedTensors saved;
  for (const auto& item : norm_fused->named_parameters())
    saved.emplace_back("norm." + item.key(), item.value());
  for (const auto& item : mlp_fused->named_parameters())
    saved.emplace_back("mlp." + item.key(), item.value());
  const auto path =
      std::filesystem::temp_directory_path() / "dspine_norm_mlp_checkpoint.safetensors";
  core::save_safetensors(path.string(), saved);

  model::RMSNorm norm_ref(64, 1e-6, false);
  model::SwiGLUMLP mlp_ref(64, 160, false);
  const auto loaded = core::load_safetensors(path.string());
  {
    torch::NoGradGuard no_grad;
    for (auto& item : norm_ref->named_parameters())
      item.value().copy_(loaded.at("norm." + item.key()));
    for (auto& item : mlp_ref->named_parameters())
      item.value().copy_(loaded.at("mlp." + item.key()));
  }
  std::filesystem::remove(path);
  norm_fused->to(kCuda);
  mlp_fused->to(kCuda);
  norm_ref->to(kCuda);
  mlp_ref->to(kCuda);
  const auto x = torch::randn({5, 64}, kCuda);
  const auto y_fused = mlp_fused(norm_fused(x));
  const auto y_ref = mlp_ref(norm_ref(x));
  EXPECT_LE(testing::max_abs_diff(y_fused, y_ref), 1e-5);
}

}  // namespace
}  // namespace dspine
