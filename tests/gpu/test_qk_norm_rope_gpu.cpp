// The fused q/k RMSNorm + RoPE kernels (src/kernels/qk_norm_rope.cu) against the ATen reference
// (ops::qk_norm_rope_reference): output and the x and weight gradients by autograd. fp32 inputs
// within rtol/atol 1e-5 (dweight's absolute tolerance scaled by its largest entry, since it sums
// B·P·heads terms); bf16 inputs against the fp32 reference on the same bf16 values, by relative
// error (≤ 1e-2 of the norm) and cosine (≥ 0.9999) as for the other bf16 kernels. Shapes: D 128
// and 64, 32 and 8 heads, P 37 of 50 table positions, B 2, the recipe's q and k (also timed
// against the bf16 reference); a strided x read in place; bitwise determinism; the applicability
// rules; and the draft's attention layer, fused (the fused op's node in its graph) against the
// reference modules on the same weights.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/parity.h"
#include "common/require_cuda.h"
#include "core/config.h"
#include "model/attention.h"
#include "model/block_mask.h"
#include "model/rope.h"
#include "ops/qk_norm_rope_ops.h"

namespace dspine {
namespace {

const torch::Device kCuda(torch::kCUDA, 0);
constexpr double kEps = 1e-6;

struct Case {
  int64_t batch, positions, total, heads, head_dim;
};

struct Inputs {
  torch::Tensor x, weight, cos, sin, dout;
};

// Random x, a weight near 1, Qwen3 rope tables of random positions and an output gradient.
Inputs make_inputs(const Case& c, torch::Dtype dtype, uint64_t seed) {
  torch::manual_seed(seed);
  auto options = torch::TensorOptions().dtype(dtype).device(kCuda);
  Inputs in;
  in.x = torch::randn({c.batch, c.positions, c.heads, c.head_dim}, options);
  in.weight = (1 + 0.2 * torch::randn({c.head_dim}, options.dtype(torch::kFloat))).to(dtype);
  auto positions = torch::randint(0, 4096, {c.batch, c.total}, options.dtype(torch::kLong));
  auto tables = model::rope_tables(positions, model::rope_inv_freq(c.head_dim, 1e6), dtype);
  in.cos = tables.cos;
  in.sin = tables.sin;
  in.dout = torch::randn({c.batch, c.positions, c.heads, c.head_dim}, options);
  return in;
}

struct Result {
  torch::Tensor out, dx, dweight;
};

Result run_fused(const Inputs& in, const torch::Tensor& x_view) {
  auto x = x_view.detach().requires_grad_(true);
  auto weight = in.weight.clone().requires_grad_(true);
  auto out = ops::qk_norm_rope(x, weight, kEps, in.cos, in.sin);
  out.backward(in.dout);
  return {out.detach(), x.grad(), weight.grad()};
}

Result run_fused(const Inputs& in) { return run_fused(in, in.x.clone()); }

// The reference in fp32 on the same (possibly bf16-rounded) values.
Result run_reference(const Inputs& in) {
  // Fresh leaves: for fp32 inputs .to() would return in.x itself.
  auto x = in.x.to(torch::kFloat).clone().requires_grad_(true);
  auto weight = in.weight.to(torch::kFloat).clone().requires_grad_(true);
  auto out = ops::qk_norm_rope_reference(x, weight, kEps, in.cos.to(torch::kFloat),
                                         in.sin.to(torch::kFloat));
  out.backward(in.dout.to(torch::kFloat));
  return {out.detach(), x.grad(), weight.grad()};
}

// Elementwise within rtol 1e-5 and `atol` (testing::expect_allclose, torch::allclose's bound).
void expect_allclose(const torch::Tensor& fused, const torch::Tensor& reference, double atol,
                     const std::string& what) {
  ASSERT_EQ(fused.sizes(), reference.sizes()) << what;
  testing::expect_allclose(fused, reference, 1e-5, atol, what);
  std::printf("%-44s max abs difference %.2e\n", what.c_str(),
              testing::max_abs_diff(fused, reference));
}

// Finite, and within `max_relative` by the norm of the difference and `min_cosine` by the angle.
void expect_close(const torch::Tensor& fused, const torch::Tensor& reference,
                  const std::string& what, double max_relative = 1e-2, double min_cosine = 0.9999) {
  ASSERT_EQ(fused.sizes(), reference.sizes()) << what;
  ASSERT_TRUE(torch::isfinite(fused).all().item<bool>()) << what;
  const double relative = testing::norm_relative_error(fused, reference);
  const double cosine = testing::cosine(fused, reference);
  EXPECT_LE(relative, max_relative) << what << ": relative error";
  EXPECT_GE(cosine, min_cosine) << what << ": cosine";
  std::printf("%-44s relative error %.2e, cosine %.8f\n", what.c_str(), relative, cosine);
}

std::string name_of(const Case& c) {
  return "B" + std::to_string(c.batch) + " P" + std::to_string(c.positions) + "/" +
         std::to_string(c.total) + " H" + std::to_string(c.heads) + " D" +
         std::to_string(c.head_dim);
}

void check_fp32(const Case& c) {
  const auto in = make_inputs(c, torch::kFloat, 11);
  const auto fused = run_fused(in), reference = run_reference(in);
  const std::string name = "fp32 " + name_of(c);
  expect_allclose(fused.out, reference.out, 1e-5, name + " out");
  expect_allclose(fused.dx, reference.dx, 1e-5, name + " dx");
  const double scale = reference.dweight.abs().max().item<double>();
  expect_allclose(fused.dweight, reference.dweight, 1e-5 * scale, name + " dweight");
}

// bf16 (or fp16) inputs against the fp32 reference on the same values.
void check_16bit(const Case& c, torch::Dtype dtype = torch::kBFloat16) {
  const auto in = make_inputs(c, dtype, 13);
  const auto fused = run_fused(in), reference = run_reference(in);
  const std::string name = (dtype == torch::kHalf ? "fp16 " : "bf16 ") + name_of(c);
  expect_close(fused.out, reference.out, name + " out");
  expect_close(fused.dx, reference.dx, name + " dx");
  expect_close(fused.dweight, reference.dweight, name + " dweight");
}

TEST(QkNormRopeGpu, Fp32MatchesReference) {
  REQUIRE_CUDA();
  for (const Case& c : {Case{2, 37, 50, 32, 128}, Case{2, 37, 50, 8, 128}, Case{2, 37, 50, 32, 64},
                        Case{2, 37, 50, 8, 64}, Case{1, 16, 16, 4, 128}}) {
    check_fp32(c);
  }
}

TEST(QkNormRopeGpu, Bf16MatchesFp32Reference) {
  REQUIRE_CUDA();
  for (const Case& c : {Case{2, 37, 50, 32, 128}, Case{2, 37, 50, 8, 128}, Case{2, 37, 50, 32, 64},
                        Case{2, 37, 50, 8, 64}}) {
    check_16bit(c);
  }
  check_16bit({2, 37, 50, 8, 128}, torch::kHalf);  // the kernels take fp16 as well
}

// Milliseconds per call of fn (forward and backward), over 10 calls after a warm-up.
template <typename F>
double milliseconds_per_call(F&& fn) {
  fn();
  torch::cuda::synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) fn();
  torch::cuda::synchronize();
  const std::chrono::duration<double, std::milli> elapsed =
      std::chrono::steady_clock::now() - start;
  return elapsed.count() / 10;
}

// The bf16 reference path as the attention layer ran it before the fused kernels.
void run_bf16_reference(const Inputs& in) {
  auto x = in.x.clone().requires_grad_(true);
  auto weight = in.weight.clone().requires_grad_(true);
  ops::qk_norm_rope_reference(x, weight, kEps, in.cos, in.sin).backward(in.dout);
}

TEST(QkNormRopeGpu, RecipeShapesMatchFp32Reference) {
  REQUIRE_CUDA();
  // configs/qwen3-8b-dspine.yaml: queries [2, 8192, 32, 128] over the last 8192 of 11264 table
  // positions; keys [2, 11264, 8, 128] over all of them.
  for (const Case& c : {Case{2, 8192, 11264, 32, 128}, Case{2, 11264, 11264, 8, 128}}) {
    check_16bit(c);
    const auto in = make_inputs(c, torch::kBFloat16, 13);
    std::printf("%-36s forward + backward, fused vs reference: %.3f ms vs %.3f ms\n",
                ("bf16 " + name_of(c)).c_str(), milliseconds_per_call([&] { run_fused(in); }),
                milliseconds_per_call([&] { run_bf16_reference(in); }));
  }
}

TEST(QkNormRopeGpu, StridedInputIsReadInPlaceWithTheSameResult) {
  REQUIRE_CUDA();
  const Case c{2, 37, 50, 8, 128};
  const auto in = make_inputs(c, torch::kFloat, 5);
  // x as the first 8 heads of a [B, P, 12, D] projection: rows 12·D apart.
  auto wide = torch::randn({c.batch, c.positions, 12, c.head_dim}, in.x.options());
  wide.slice(2, 0, 8).copy_(in.x);
  const auto strided = run_fused(in, wide.slice(2, 0, 8));
  const auto contiguous = run_fused(in);
  EXPECT_TRUE(torch::equal(strided.out, contiguous.out));
  EXPECT_TRUE(torch::equal(strided.dx, contiguous.dx));
  EXPECT_TRUE(torch::equal(strided.dweight, contiguous.dweight));
}

TEST(QkNormRopeGpu, IsDeterministic) {
  REQUIRE_CUDA();
  const auto in = make_inputs({2, 1000, 1200, 8, 128}, torch::kBFloat16, 7);
  const auto first = run_fused(in), second = run_fused(in);
  EXPECT_TRUE(torch::equal(first.out, second.out));
  EXPECT_TRUE(torch::equal(first.dx, second.dx));
  EXPECT_TRUE(torch::equal(first.dweight, second.dweight));
}

TEST(QkNormRopeGpu, FusableRules) {
  REQUIRE_CUDA();
  const auto in = make_inputs({2, 5, 9, 4, 64}, torch::kBFloat16, 1);
  EXPECT_TRUE(ops::qk_norm_rope_fusable(in.x, in.weight, in.cos, in.sin));
  const auto d96 = make_inputs({2, 5, 9, 4, 96}, torch::kBFloat16, 1);
  EXPECT_FALSE(ops::qk_norm_rope_fusable(d96.x, d96.weight, d96.cos, d96.sin)) << "head_dim 96";
  const auto d16 = make_inputs({2, 5, 9, 4, 16}, torch::kBFloat16, 1);
  EXPECT_FALSE(ops::qk_norm_rope_fusable(d16.x, d16.weight, d16.cos, d16.sin)) << "head_dim 16";
  EXPECT_FALSE(ops::qk_norm_rope_fusable(in.x.to(torch::kDouble), in.weight.to(torch::kDouble),
                                         in.cos.to(torch::kDouble), in.sin.to(torch::kDouble)));
  EXPECT_FALSE(ops::qk_norm_rope_fusable(in.x, in.weight.to(torch::kFloat), in.cos, in.sin));
  EXPECT_FALSE(ops::qk_norm_rope_fusable(in.x, in.weight, in.cos.slice(1, 5), in.sin.slice(1, 5)))
      << "tables shorter than P";
  EXPECT_FALSE(
      ops::qk_norm_rope_fusable(in.x, in.weight, in.cos.clone().requires_grad_(true), in.sin))
      << "tables with grad";
  EXPECT_FALSE(ops::qk_norm_rope_fusable(in.x[0], in.weight, in.cos, in.sin)) << "3-d x";
}

// A small draft attention layer (block-kernel heads: D 64, 4 query heads over 2 kv heads, bs 16)
// with fused kernels against the reference modules on the same weights and inputs; the dense
// mask, so that the two differ only in the q/k norm and RoPE.
core::ModelConfig attention_config() {
  core::ModelConfig c;
  c.hidden_size = 128;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.block_size = 16;
  return c;
}

struct AttentionResult {
  torch::Tensor out, dx, dcontext;
  std::map<std::string, torch::Tensor> grads;
  bool ran_fused_kernels = false;  // the fused op's autograd node is in the output's graph
};

// Whether an autograd node whose name contains `name` produced t (directly or upstream).
bool graph_contains(const torch::Tensor& t, const std::string& name) {
  std::vector<torch::autograd::Node*> pending{t.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!pending.empty()) {
    torch::autograd::Node* node = pending.back();
    pending.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    if (node->name().find(name) != std::string::npos) return true;
    for (const auto& edge : node->next_edges()) pending.push_back(edge.function.get());
  }
  return false;
}

AttentionResult run_attention(bool fused, torch::Dtype dtype) {
  const auto c = attention_config();
  torch::manual_seed(21);
  model::DSpineAttention attention(c, fused);
  for (auto& p : attention->named_parameters()) {
    torch::NoGradGuard no_grad;
    p.value().normal_(0.0, 0.05);
    if (p.key().find("norm") != std::string::npos) p.value().add_(1.0);
  }
  attention->to(kCuda, dtype);
  const int64_t rows = 2, context = 40, blocks = 3, queries = blocks * c.block_size;
  auto options = torch::TensorOptions().dtype(dtype).device(kCuda);
  auto fp32 = options.dtype(torch::kFloat);
  auto x = torch::randn({rows, queries, c.hidden_size}, fp32).to(dtype).requires_grad_(true);
  auto ctx = torch::randn({rows, context, c.hidden_size}, fp32).to(dtype).requires_grad_(true);
  auto anchors = torch::tensor({5, 20, 33, 0, 17, 39}, torch::kLong).view({rows, blocks});
  auto keep = torch::ones({rows, blocks}, torch::kBool);
  keep[1][1] = false;
  auto mask = model::prepare_attention_mask(
      model::block_attention_mask(anchors.to(kCuda), keep.to(kCuda), context, c.block_size));
  auto positions =
      torch::arange(context + queries, options.dtype(torch::kLong)).unsqueeze(0).repeat({rows, 1});
  auto rope = model::rope_tables(positions, model::rope_inv_freq(c.head_dim, c.rope_theta), dtype);
  auto out = attention(x, ctx, mask, rope);
  const bool ran_fused_kernels = graph_contains(out, "QkNormRopeFunction");
  out.backward(torch::randn(out.sizes(), fp32).to(dtype));
  AttentionResult result{out.detach(), x.grad(), ctx.grad(), {}, ran_fused_kernels};
  for (auto& p : attention->named_parameters()) result.grads[p.key()] = p.value().grad();
  return result;
}

TEST(QkNormRopeGpu, AttentionLayerMatchesReferenceModules) {
  REQUIRE_CUDA();
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const std::string tag = dtype == torch::kFloat ? "fp32 attention " : "bf16 attention ";
    const auto fused = run_attention(true, dtype);
    const auto reference = run_attention(false, dtype);
    EXPECT_TRUE(fused.ran_fused_kernels) << tag;
    EXPECT_FALSE(reference.ran_fused_kernels) << tag;
    // In bf16 both sides round (the reference after each op), so they may differ by up to twice
    // what either differs from fp32: twice the kernel tolerances.
    const double relative = dtype == torch::kFloat ? 1e-2 : 2e-2;
    const double cosine = dtype == torch::kFloat ? 0.9999 : 0.9998;
    expect_close(fused.out, reference.out, tag + "out", relative, cosine);
    expect_close(fused.dx, reference.dx, tag + "dx", relative, cosine);
    expect_close(fused.dcontext, reference.dcontext, tag + "dcontext", relative, cosine);
    for (const auto& [name, grad] : reference.grads) {
      expect_close(fused.grads.at(name), grad, tag + name, relative, cosine);
    }
    if (dtype == torch::kFloat) {
      testing::expect_allclose(fused.out, reference.out, 1e-4, 1e-5, tag + "out elementwise");
      testing::expect_allclose(fused.grads.at("q_norm.weight"), reference.grads.at("q_norm.weight"),
                               1e-4, 1e-4, tag + "q_norm.weight elementwise");
    }
  }
}

}  // namespace
}  // namespace dspine
