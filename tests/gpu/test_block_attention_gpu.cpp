// The fused DSpine block attention (src/kernels/block_attention.cu) against the dense masked SDPA
// reference (model::masked_attention) evaluated in fp32 on the same bf16 inputs: output and the
// q/k/v gradients by relative error (≤ 1e-2 of the norm, as for the other bf16 kernels) and cosine
// (≥ 0.9999), on shapes that exercise partial key tiles, padded query rows, anchors at 0, dropped
// blocks, unsorted anchors and both head sizes; exact zeros for dropped blocks; bitwise
// determinism.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/cuda/CUDAContext.h>

#include <string>

#include "common/require_cuda.h"
#include "kernels/block_attention.h"
#include "model/attention.h"
#include "model/block_mask.h"
#include "ops/block_attention_ops.h"

namespace dspine {
namespace {

const torch::Device kCuda(torch::kCUDA, 0);

struct Case {
  int64_t rows, context, blocks, block_size, heads, kv_heads, head_dim;
  bool sorted;
};

struct Inputs {
  torch::Tensor q, k, v, dout, anchors, keep;
  double scale;
};

Inputs make_inputs(const Case& c, uint64_t seed) {
  torch::manual_seed(seed);
  Inputs in;
  const int64_t queries = c.blocks * c.block_size;
  auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(kCuda);
  in.q = torch::randn({c.rows, queries, c.heads, c.head_dim}, bf16);
  in.k = torch::randn({c.rows, c.context + queries, c.kv_heads, c.head_dim}, bf16);
  in.v = torch::randn({c.rows, c.context + queries, c.kv_heads, c.head_dim}, bf16);
  in.dout = torch::randn({c.rows, queries, c.heads, c.head_dim}, bf16);
  in.anchors = torch::randint(0, c.context - 1, {c.rows, c.blocks}, torch::kInt64);
  if (c.sorted) in.anchors = std::get<0>(in.anchors.sort(1));
  in.anchors[0][0] = 0;                      // a block with no context key
  in.anchors[c.rows - 1][c.blocks - 1] = c.context - 2;  // the longest prefix
  in.keep = torch::ones({c.rows, c.blocks}, torch::kBool);
  in.keep[0][c.blocks / 2] = false;
  in.anchors = in.anchors.to(kCuda);
  in.keep = in.keep.to(kCuda);
  in.scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  return in;
}

struct Result {
  torch::Tensor out, dq, dk, dv;
};

Result run_fused(const Inputs& in, int64_t block_size) {
  auto q = in.q.clone().requires_grad_(true), k = in.k.clone().requires_grad_(true),
       v = in.v.clone().requires_grad_(true);
  auto out = ops::block_attention(q, k, v, in.anchors, in.keep, block_size, in.scale);
  out.backward(in.dout);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

Result run_reference(const Inputs& in, int64_t block_size) {
  auto q = in.q.to(torch::kFloat32).requires_grad_(true);
  auto k = in.k.to(torch::kFloat32).requires_grad_(true);
  auto v = in.v.to(torch::kFloat32).requires_grad_(true);
  const int64_t context = in.k.size(1) - in.q.size(1);
  auto mask = model::prepare_attention_mask(
      model::block_attention_mask(in.anchors, in.keep, context, block_size));
  auto out = model::masked_attention(q, k, v, mask, in.scale);
  out.backward(in.dout.to(torch::kFloat32));
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

void expect_close(const torch::Tensor& fused, const torch::Tensor& reference,
                  const std::string& what) {
  ASSERT_EQ(fused.sizes(), reference.sizes()) << what;
  const auto a = fused.to(torch::kFloat64), e = reference.to(torch::kFloat64);
  ASSERT_TRUE(torch::isfinite(a).all().item<bool>()) << what;
  const double relative = ((a - e).norm() / e.norm().clamp_min(1e-30)).item<double>();
  const double cosine = ((a * e).sum() / (a.norm() * e.norm()).clamp_min(1e-30)).item<double>();
  EXPECT_LE(relative, 1e-2) << what;
  EXPECT_GE(cosine, 0.9999) << what;
  std::printf("%-40s relative error %.2e, cosine %.8f\n", what.c_str(), relative, cosine);
}

void check_case(const Case& c, const std::string& name) {
  auto in = make_inputs(c, 17);
  auto fused = run_fused(in, c.block_size);
  auto reference = run_reference(in, c.block_size);
  expect_close(fused.out, reference.out, name + " out");
  expect_close(fused.dq, reference.dq, name + " dq");
  expect_close(fused.dk, reference.dk, name + " dk");
  expect_close(fused.dv, reference.dv, name + " dv");

  // The dropped block: zero output and no gradient into its queries or its own keys.
  const int64_t n = c.blocks / 2, bs = c.block_size;
  auto rows = fused.out[0].slice(0, n * bs, (n + 1) * bs);
  EXPECT_TRUE(rows.eq(0).all().item<bool>()) << name;
  EXPECT_TRUE(fused.dq[0].slice(0, n * bs, (n + 1) * bs).eq(0).all().item<bool>()) << name;
  const int64_t own = c.context + n * bs;
  EXPECT_TRUE(fused.dk[0].slice(0, own, own + bs).eq(0).all().item<bool>()) << name;
  EXPECT_TRUE(fused.dv[0].slice(0, own, own + bs).eq(0).all().item<bool>()) << name;
}

TEST(BlockAttentionGpu, RecipeHeadsMatchDenseReference) {
  REQUIRE_CUDA();
  // bs 16 × 4 query heads per kv head = 64 rows per CTA; S 200 ends in a partial key tile.
  check_case({2, 200, 12, 16, 32, 8, 128, true}, "bs16 H32/8 D128");
}

TEST(BlockAttentionGpu, PaddedRowsAndSmallHeadsMatchDenseReference) {
  REQUIRE_CUDA();
  // bs 8 × 2 = 16 of 64 rows used; D 64; unsorted anchors.
  check_case({2, 130, 9, 8, 4, 2, 64, false}, "bs8 H4/2 D64 unsorted");
  // No GQA, bs 4, D 128, one row.
  check_case({1, 70, 5, 4, 2, 2, 128, true}, "bs4 H2/2 D128");
}

TEST(BlockAttentionGpu, LongPrefixesMatchDenseReference) {
  REQUIRE_CUDA();
  check_case({1, 1100, 40, 16, 8, 2, 128, true}, "bs16 H8/2 D128 S1100");
}

TEST(BlockAttentionGpu, RecipeShapeMatchesDenseReference) {
  REQUIRE_CUDA();
  // configs/qwen3-8b-dspine.yaml: S 3072, 512 blocks of 16 per row, 32/8 heads, head_dim 128.
  check_case({2, 3072, 512, 16, 32, 8, 128, true}, "recipe shape");
}

// The kernels' two instruction sets on the same inputs (the tests above run the automatic one,
// wgmma where available): the same bf16 probabilities and fp32 accumulation in another order, so
// outputs, log-sum-exps and gradients agree to a few bf16 units. The backward of both runs from the
// mma.sync forward's output and log-sum-exp.
TEST(BlockAttentionGpu, WgmmaKernelsMatchMmaSyncKernels) {
  REQUIRE_CUDA();
  if (!kernels::block_attention_wgmma_available(128)) GTEST_SKIP() << "no wgmma kernels here";
  using kernels::AttentionInstructions;
  for (const Case& c : {Case{2, 3072, 512, 16, 32, 8, 128, true},
                        Case{2, 200, 12, 16, 32, 8, 128, false},
                        Case{1, 70, 5, 4, 2, 2, 128, true}}) {
    auto in = make_inputs(c, 23);
    const kernels::BlockAttentionShape shape{c.rows,  c.context,  c.blocks,  c.block_size,
                                             c.heads, c.kv_heads, c.head_dim};
    const auto keep = in.keep.to(torch::kUInt8);
    const auto stats = in.q.options().dtype(torch::kFloat32);
    const auto stream = at::cuda::getCurrentCUDAStream();
    auto forward = [&](AttentionInstructions instructions) {
      auto out = torch::full_like(in.q, NAN);
      auto lse = torch::full({c.rows, c.blocks * c.block_size, c.heads}, NAN, stats);
      EXPECT_EQ(kernels::block_attention_forward(
                    shape, in.q.data_ptr(), in.k.data_ptr(), in.v.data_ptr(),
                    in.anchors.data_ptr<int64_t>(), keep.data_ptr<uint8_t>(),
                    static_cast<float>(in.scale), out.data_ptr(), lse.data_ptr<float>(), stream,
                    instructions),
                cudaSuccess);
      return std::pair{out, lse};
    };
    const auto [wgmma_out, wgmma_lse] = forward(AttentionInstructions::kAutomatic);
    const auto [mma_out, mma_lse] = forward(AttentionInstructions::kMmaSync);
    const std::string name = "S " + std::to_string(c.context) + " N " + std::to_string(c.blocks);
    expect_close(wgmma_out, mma_out, name + " wgmma vs mma.sync out");
    const auto finite = torch::isfinite(mma_lse);
    EXPECT_TRUE(torch::equal(finite, torch::isfinite(wgmma_lse))) << name;
    EXPECT_LT((wgmma_lse - mma_lse).masked_select(finite).abs().max().item<double>(), 1e-3)
        << name << " lse";

    auto backward = [&](AttentionInstructions instructions) {
      Result r{mma_out, torch::full_like(in.q, NAN), torch::full_like(in.k, NAN),
               torch::full_like(in.v, NAN)};
      auto delta = torch::empty_like(mma_lse);
      EXPECT_EQ(kernels::block_attention_backward(
                    shape, in.q.data_ptr(), in.k.data_ptr(), in.v.data_ptr(), mma_out.data_ptr(),
                    in.dout.data_ptr(), mma_lse.data_ptr<float>(), in.anchors.data_ptr<int64_t>(),
                    keep.data_ptr<uint8_t>(), static_cast<float>(in.scale),
                    delta.data_ptr<float>(), r.dq.data_ptr(), r.dk.data_ptr(), r.dv.data_ptr(),
                    stream, instructions),
                cudaSuccess);
      return r;
    };
    const Result wgmma = backward(AttentionInstructions::kAutomatic);
    const Result mma = backward(AttentionInstructions::kMmaSync);
    expect_close(wgmma.dq, mma.dq, name + " wgmma vs mma.sync dq");
    expect_close(wgmma.dk, mma.dk, name + " wgmma vs mma.sync dk");
    expect_close(wgmma.dv, mma.dv, name + " wgmma vs mma.sync dv");
  }
}

TEST(BlockAttentionGpu, IsDeterministic) {
  REQUIRE_CUDA();
  const Case c{2, 300, 20, 16, 32, 8, 128, true};
  auto in = make_inputs(c, 3);
  auto first = run_fused(in, c.block_size);
  auto second = run_fused(in, c.block_size);
  EXPECT_TRUE(torch::equal(first.out, second.out));
  EXPECT_TRUE(torch::equal(first.dq, second.dq));
  EXPECT_TRUE(torch::equal(first.dk, second.dk));
  EXPECT_TRUE(torch::equal(first.dv, second.dv));
}

TEST(BlockAttentionGpu, RefusesUnsupportedInputsByName) {
  REQUIRE_CUDA();
  auto in = make_inputs({1, 70, 5, 4, 2, 2, 128, true}, 1);
  try {
    ops::block_attention(in.q.to(torch::kFloat32), in.k.to(torch::kFloat32),
                         in.v.to(torch::kFloat32), in.anchors, in.keep, 4, in.scale);
    FAIL() << "fp32 inputs accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("fused block attention needs CUDA bf16"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dspine
