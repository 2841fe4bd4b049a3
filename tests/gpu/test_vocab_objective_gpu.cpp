// The fused vocabulary objective's CUDA row kernel against its ATen row pass on the same CUDA
// logits: fp32 (tight), bf16 at the recipe's vocabulary (values within bf16 tolerance, gradient
// cosine), the CE-only form, hand-built rows, teacher states read by position through an index,
// the top-k candidates against torch::topk (ties by lower index), and the memory claim at the
// recipe's size (no [rows, V] tensor: the peak stays within 1 GiB above the inputs and dX).
#include <gtest/gtest.h>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "common/require_cuda.h"
#include "kernels/vocab_objective.h"
#include "ops/vocab_objective_ops.h"
#include "ops/vocab_rows.h"

namespace dspine::ops {
namespace {

struct Inputs {
  torch::Tensor hidden, teacher, labels, weights, lm_head;
};

Inputs random_inputs(int64_t rows, int64_t hidden, int64_t vocab, torch::Dtype dtype) {
  torch::manual_seed(11);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  Inputs in;
  in.hidden = torch::randn({rows, hidden}, cuda).to(dtype);
  in.teacher = (in.hidden.to(torch::kFloat32) + 0.5 * torch::randn({rows, hidden}, cuda)).to(dtype);
  in.labels = torch::randint(0, vocab, {rows}, cuda.dtype(torch::kInt64));
  in.weights = torch::rand({rows}, cuda);
  in.weights.index_put_({torch::arange(0, rows, 5, cuda.dtype(torch::kInt64))}, 0.0);
  in.lm_head = (torch::randn({vocab, hidden}, cuda) * (2.0 / std::sqrt(double(hidden)))).to(dtype);
  return in;
}

struct Run {
  VocabObjectiveResult result;
  torch::Tensor grad;
};

Run run(const Inputs& in, bool kernel, int64_t chunk_rows) {
  VocabObjectiveOptions o;
  o.ce_weight = 0.1;
  o.top_k = 16;
  o.chunk_rows = chunk_rows;
  o.use_kernel = kernel;
  auto x = in.hidden.detach().clone().requires_grad_(true);
  Run r;
  r.result = vocab_objective(x, in.teacher, in.labels, in.weights, in.lm_head, o);
  r.result.loss.backward();
  r.grad = x.grad().to(torch::kFloat32);
  return r;
}

void expect_close(const torch::Tensor& a, const torch::Tensor& b, double tol, const std::string& what) {
  const auto fa = a.to(torch::kFloat32), fb = b.to(torch::kFloat32);
  const double scale = std::max(1.0, fb.abs().max().item<double>());
  EXPECT_LE((fa - fb).abs().max().item<double>(), tol * scale) << what;
}

TEST(VocabObjectiveGpu, Fp32KernelMatchesTheAtenRowPass) {
  REQUIRE_CUDA();
  // 4096: 16-byte packs; 1003: rows not 16-byte aligned, the scalar path and its tail.
  for (int64_t vocab : {4096, 1003}) {
    const auto in = random_inputs(37, 64, vocab, torch::kFloat32);
    const auto tag = "V " + std::to_string(vocab);
    const auto aten = run(in, false, 16);
    const auto fused = run(in, true, 16);
    expect_close(fused.result.loss, aten.result.loss, 1e-5, tag + " loss");
    expect_close(fused.result.ce, aten.result.ce, 1e-5, tag + " ce");
    expect_close(fused.result.l1, aten.result.l1, 1e-5, tag + " l1");
    expect_close(fused.grad, aten.grad, 1e-5, tag + " grad");
    expect_close(fused.result.teacher_candidates, aten.result.teacher_candidates, 1e-5,
                 tag + " teacher probs");
    EXPECT_TRUE(torch::equal(fused.result.argmax, aten.result.argmax)) << tag;
    EXPECT_TRUE(torch::equal(fused.result.candidates, aten.result.candidates)) << tag;

    VocabObjectiveOptions o;
    o.use_kernel = true;
    const auto ce_kernel = vocab_ce(in.hidden, in.labels, in.lm_head, o);
    o.use_kernel = false;
    const auto ce_aten = vocab_ce(in.hidden, in.labels, in.lm_head, o);
    expect_close(ce_kernel.ce, ce_aten.ce, 1e-5, tag + " CE-only ce");
    EXPECT_TRUE(torch::equal(ce_kernel.argmax, ce_aten.argmax)) << tag;
  }
}

TEST(VocabObjectiveGpu, HandBuiltRowsMatchTheAtenRowPass) {
  REQUIRE_CUDA();
  // p = q; weight 0; exact ties at entries 0 and 1 (sign(0) = 0); the first of equal maxima.
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  auto z = torch::tensor({{1.f, 2.f, 0.5f, -1.f}, {3.f, 0.f, 0.f, 3.f}, {0.f, 0.f, 0.f, -30.f}})
               .to(torch::kCUDA);
  auto t = torch::tensor({{1.f, 2.f, 0.5f, -1.f}, {0.f, 1.f, 2.f, 3.f}, {0.f, 0.f, -30.f, 0.f}})
               .to(torch::kCUDA);
  auto labels = torch::tensor({1, 2, 0}, cuda.dtype(torch::kInt64));
  VocabRowGradient gradient{torch::tensor({0.7f, 0.f, 1.3f}).to(torch::kCUDA), 0.25, 0.75};
  auto g_kernel = z.clone(), g_aten = z.clone();
  const auto k = vocab_rows(g_kernel, t, labels, &gradient, true);
  const auto a = vocab_rows(g_aten, t, labels, &gradient, false);
  expect_close(g_kernel, g_aten, 1e-6, "gradient");
  expect_close(k.l1, a.l1, 1e-6, "l1");
  expect_close(k.ce, a.ce, 1e-6, "ce");
  EXPECT_EQ(k.l1[0].item<float>(), 0.f);
  EXPECT_TRUE(torch::equal(g_kernel[1], torch::zeros({4}, cuda)));
  // p = (1/3, 1/3, 1/3, ~0), q = (1/3, 1/3, ~0, 1/3): S = 1/3 (it would be 1 with sign(0) = 1).
  EXPECT_NEAR(g_kernel[2][0].item<double>(), 1.3 * (0.25 * (1.0 / 3 - 1) - 0.75 / 9), 1e-6);
  EXPECT_NEAR(g_kernel[2][1].item<double>(), 1.3 * (0.25 / 3 - 0.75 / 9), 1e-6);
  EXPECT_EQ(k.argmax[1].item<int64_t>(), 0);
}

// The GSPO policy gradient folded into the kernel's pass 3 against the ATen row pass: fp32 with
// 16-byte packs and the scalar path (V 1003), bf16 at the recipe's vocabulary. Samples repeat a
// token in a row, land on the row's label and on the last column, one row is masked, and one of
// supervised weight 0 has coefficients summing to 0.
TEST(VocabObjectiveGpu, PolicyGradientInTheKernelMatchesTheAtenRowPass) {
  REQUIRE_CUDA();
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  for (auto [vocab, dtype] : {std::pair<int64_t, torch::Dtype>{4096, torch::kFloat32},
                              {1003, torch::kFloat32},
                              {151936, torch::kBFloat16}}) {
    torch::manual_seed(21);
    const int64_t rows = 40, group = 4;
    auto z = (torch::randn({rows, vocab}, cuda) * 3).to(dtype);
    auto t = (z.to(torch::kFloat32) + torch::randn({rows, vocab}, cuda)).to(dtype);
    auto labels = torch::randint(0, vocab, {rows}, cuda.dtype(torch::kInt64));
    auto targets = torch::randint(0, vocab, {rows, group}, cuda.dtype(torch::kInt64));
    targets.select(1, 1).copy_(targets.select(1, 0));
    targets.select(1, 2).copy_(labels);
    targets[0][3] = vocab - 1;
    targets[5].fill_(-100);
    auto coefficients = torch::randn({rows, group}, cuda) * 0.3;
    coefficients[5].zero_();
    VocabRowGradient gradient{torch::rand({rows}, cuda), 0.1, 0.9};
    gradient.weights[7] = 0.f;  // the policy gradient alone
    gradient.weights[9] = 0.f;  // ... with coefficients that cancel: C = 0, the columns are not
    coefficients[9].copy_(torch::tensor({0.25f, -0.25f, 0.5f, -0.5f}));
    gradient.policy_total = coefficients.sum(1);
    gradient.policy_targets = targets;
    gradient.policy_coefficients = coefficients;
    auto g_kernel = z.clone(), g_aten = z.clone();
    vocab_rows(g_kernel, t, labels, &gradient, true);
    vocab_rows(g_aten, t, labels, &gradient, false);
    const auto tag = "V " + std::to_string(vocab);
    if (dtype == torch::kFloat32) {
      expect_close(g_kernel, g_aten, 1e-5, tag + " gradient");
    } else {
      // Both round their fp32 gradient to bf16 once; the exponentials differ in the last bits.
      const auto a = g_kernel.to(torch::kFloat32), b = g_aten.to(torch::kFloat32);
      const double cosine = torch::cosine_similarity(a.flatten(), b.flatten(), 0).item<double>();
      EXPECT_GE(cosine, 0.99999) << tag;
      const auto at = targets.clamp_min(0);
      expect_close(a.gather(1, at), b.gather(1, at), 1e-2, tag + " sampled columns");
    }
    EXPECT_GT(g_kernel[7].abs().max().item<double>(), 0.0) << tag;
    EXPECT_GT(g_kernel[9].abs().max().item<double>(), 0.1) << tag << ": cancelling coefficients";
  }
}

TEST(VocabObjectiveGpu, Bf16AtTheRecipeVocabularyMatchesTheAtenRowPass) {
  REQUIRE_CUDA();
  const auto in = random_inputs(300, 256, 151936, torch::kBFloat16);
  const auto aten = run(in, false, 128);
  const auto fused = run(in, true, 128);
  // Both read the same bf16 logits and compute in fp32: the values agree closely.
  expect_close(fused.result.loss, aten.result.loss, 1e-4, "loss");
  expect_close(fused.result.ce, aten.result.ce, 1e-4, "ce");
  expect_close(fused.result.l1, aten.result.l1, 1e-4, "l1");
  expect_close(fused.result.teacher_candidates, aten.result.teacher_candidates, 1e-4,
               "teacher probs");
  EXPECT_TRUE(torch::equal(fused.result.candidates, aten.result.candidates));
  const double agree = (fused.result.argmax == aten.result.argmax).to(torch::kFloat64).mean()
                           .item<double>();
  EXPECT_GE(agree, 0.99) << "argmax agreement";  // bf16 ties may resolve differently
  const double cosine =
      torch::cosine_similarity(fused.grad.flatten(), aten.grad.flatten(), 0).item<double>();
  EXPECT_GE(cosine, 0.9999);
  const double relative = ((fused.grad - aten.grad).norm() / aten.grad.norm()).item<double>();
  EXPECT_LE(relative, 1e-2);
}

// Teacher states by position through an index with repeats, as DSpine's overlapping blocks read
// them: the kernel (each chunk's logits once per position, rows reading them by index) against the
// ATen row pass on the teacher gathered row by row; fp32 tightly, bf16 at the recipe's vocabulary.
TEST(VocabObjectiveGpu, TeacherIndexMatchesTheGatheredTeacher) {
  REQUIRE_CUDA();
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const int64_t rows = 300, vocab = dtype == torch::kFloat32 ? 4096 : 151936;
    auto in = random_inputs(rows, 256, vocab, dtype);
    const auto cuda = torch::TensorOptions().device(torch::kCUDA);
    const auto states = torch::randn({130, 256}, cuda).to(dtype);
    auto index = ((torch::arange(rows, cuda.dtype(torch::kInt64)) * 2).div(5, "floor") +
                  torch::randint(0, 8, {rows}, cuda.dtype(torch::kInt64)))
                     .clamp_max(129);
    in.teacher = states.index_select(0, index);
    const auto aten = run(in, false, 128);
    auto x = in.hidden.detach().clone().requires_grad_(true);
    VocabObjectiveOptions o;
    o.ce_weight = 0.1;
    o.top_k = 16;
    o.chunk_rows = 128;
    o.use_kernel = true;
    auto r = vocab_objective(x, states, in.labels, in.weights, in.lm_head, o, index);
    r.loss.backward();
    const auto grad = x.grad().to(torch::kFloat32);
    const double tol = dtype == torch::kFloat32 ? 1e-5 : 1e-4;
    const std::string tag = dtype == torch::kFloat32 ? "fp32" : "bf16";
    expect_close(r.loss, aten.result.loss, tol, tag + " loss");
    expect_close(r.l1, aten.result.l1, tol, tag + " l1");
    expect_close(r.teacher_candidates, aten.result.teacher_candidates, tol, tag + " teacher probs");
    EXPECT_TRUE(torch::equal(r.candidates, aten.result.candidates)) << tag;
    if (dtype == torch::kFloat32) {
      expect_close(grad, aten.grad, tol, tag + " grad");
    } else {
      EXPECT_GE(torch::cosine_similarity(grad.flatten(), aten.grad.flatten(), 0).item<double>(),
                0.9999);
    }
  }
}

// idx [rows, k] must be what a stable descending sort of z puts first: the values of torch::topk
// exactly, equal values in index order, and of the values tied at the k-th place the lowest
// indices; where a value is unique in the row, topk's index.
void expect_stable_top_k(const torch::Tensor& z, const torch::Tensor& idx, int64_t k,
                         const std::string& what) {
  using torch::indexing::Slice;
  const auto zf = z.to(torch::kFloat32);
  const auto [top_values, top_indices] = zf.topk(k, -1);
  ASSERT_EQ(idx.sizes(), top_indices.sizes()) << what;
  const auto got = zf.gather(1, idx);
  EXPECT_TRUE(torch::equal(got, top_values)) << what << ": values";
  EXPECT_TRUE((std::get<0>(idx.sort(-1)).diff(1, -1) > 0).all().item<bool>())
      << what << ": distinct";
  const auto head = Slice(0, k - 1), tail = Slice(1, k);
  const auto tied = got.index({Slice(), head}) == got.index({Slice(), tail});
  const auto in_order = idx.index({Slice(), head}) < idx.index({Slice(), tail});
  EXPECT_TRUE((~tied | in_order).all().item<bool>()) << what << ": equal values in index order";
  const auto kth = got.index({Slice(), Slice(k - 1, k)});
  const auto last = idx.index({Slice(), Slice(k - 1, k)});
  const auto columns = torch::arange(z.size(1), idx.options()).unsqueeze(0);
  const auto before_last = ((zf == kth) & (columns < last)).sum(-1);
  EXPECT_TRUE(torch::equal(before_last, (got == kth).sum(-1) - 1))
      << what << ": the lowest indices of the values tied at the k-th place";
  auto unique = got > kth;
  unique.index({Slice(), head}) &= ~tied;
  unique.index({Slice(), tail}) &= ~tied;
  EXPECT_TRUE(torch::equal(idx.masked_select(unique), top_indices.masked_select(unique)))
      << what << ": indices of untied values";
}

// Logits with exact ties: random (bf16 rounding ties some), row 0 all equal, row 1 on a coarse
// grid, row 2 finite at three places only (-inf elsewhere: the selection must take -inf entries).
torch::Tensor tied_logits(int64_t rows, int64_t vocab, torch::Dtype dtype) {
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  auto z = 3 * torch::randn({rows, vocab}, cuda);
  z[0].fill_(0.25);
  z[1].copy_((2 * torch::randn({vocab}, cuda)).round().abs());  // abs: no -0 (sorts may split it)
  z[2].fill_(-INFINITY);
  z[2].index_put_({torch::tensor({vocab / 2, int64_t{7}, vocab - 1}, cuda.dtype(torch::kInt64))},
                  torch::tensor({1.f, 2.f, 1.f}, cuda));
  return z.to(dtype);
}

TEST(VocabObjectiveGpu, KernelTopKIsAStableDescendingTopKWithTheTeacherProbabilities) {
  REQUIRE_CUDA();
  torch::manual_seed(5);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  const int64_t rows = 24;
  // V in rows of `width`: 151936, the recipe (16-byte packs); 1000, packs, V not a multiple of
  // the block's 256 threads; 1003, rows not 16-byte aligned (one element per load); 1001 in rows
  // of 1008, packs and a scalar tail.
  const std::pair<int64_t, int64_t> shapes[] = {{151936, 151936}, {1000, 1000}, {1003, 1003},
                                                {1001, 1008}};
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const auto& [vocab, width] : shapes) {
      auto z = tied_logits(rows, width, dtype).narrow(1, 0, vocab);
      const auto t = (3 * torch::randn({rows, width}, cuda)).to(dtype).narrow(1, 0, vocab);
      const auto labels = torch::randint(0, vocab, {rows}, cuda.dtype(torch::kInt64));
      const auto q = torch::softmax(t.to(torch::kFloat32), -1);
      const double rtol = dtype == torch::kFloat32 ? 1e-5 : 1e-3;
      for (int64_t k : {1, 16, 32}) {
        const auto tag = std::string(dtype == torch::kFloat32 ? "fp32" : "bf16") + " V " +
                         std::to_string(vocab) + " k " + std::to_string(k);
        const auto r = vocab_rows(z, t, labels, nullptr, true, k);
        expect_stable_top_k(z, r.candidates, k, tag);
        // With candidates the argmax is the first one: torch's first maximal index.
        EXPECT_TRUE(torch::equal(r.argmax, z.to(torch::kFloat32).argmax(-1))) << tag << ": argmax";
        // atol: below 1e-10 the fp32 rounding of t − lse_t alone exceeds rtol.
        EXPECT_TRUE(torch::allclose(r.teacher_candidates, q.gather(1, r.candidates), rtol, 1e-10))
            << tag << ": teacher probabilities";
        auto z_aten = z.clone();
        EXPECT_TRUE(torch::equal(r.candidates,
                                 vocab_rows(z_aten, t, labels, nullptr, false, k).candidates))
            << tag << ": the ATen row pass";

        // The CE-only form selects the same candidates.
        auto ce_candidates = torch::full({rows, k}, -1, cuda.dtype(torch::kInt64));
        kernels::VocabRows draft;
        draft.draft = z.data_ptr();
        draft.type =
            dtype == torch::kFloat32 ? kernels::DType::kFloat32 : kernels::DType::kBFloat16;
        draft.rows = rows;
        draft.vocab = vocab;
        draft.row_stride = z.stride(0);
        draft.labels = labels.data_ptr<int64_t>();
        kernels::VocabRowStats stats;
        stats.top_k = static_cast<int>(k);
        stats.top_indices = ce_candidates.data_ptr<int64_t>();
        ASSERT_EQ(kernels::vocab_ce_rows(draft, stats, at::cuda::getCurrentCUDAStream()),
                  cudaSuccess);
        EXPECT_TRUE(torch::equal(ce_candidates, r.candidates)) << tag << ": CE-only form";
      }
    }
  }
}

TEST(VocabObjectiveGpu, TopKBeyondTheKernelsListFallsBackToAten) {
  REQUIRE_CUDA();
  torch::manual_seed(6);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  auto z = tied_logits(5, 1000, torch::kBFloat16);
  const auto t = torch::randn({5, 1000}, cuda).to(torch::kBFloat16);
  const auto labels = torch::zeros({5}, cuda.dtype(torch::kInt64));
  const int64_t k = kernels::kVocabMaxTopK + 1;
  const auto r = vocab_rows(z, t, labels, nullptr, true, k);
  expect_stable_top_k(z, r.candidates, k, "k 33");
  EXPECT_TRUE(torch::allclose(r.teacher_candidates,
                              torch::softmax(t.to(torch::kFloat32), -1).gather(1, r.candidates),
                              1e-3, 1e-10));
  // The kernel itself refuses it.
  kernels::VocabRows draft;
  draft.draft = z.data_ptr();
  draft.rows = 5;
  draft.vocab = 1000;
  draft.row_stride = 1000;
  draft.labels = labels.data_ptr<int64_t>();
  kernels::VocabRowStats stats;
  stats.top_k = static_cast<int>(k);
  EXPECT_EQ(kernels::vocab_ce_rows(draft, stats, at::cuda::getCurrentCUDAStream()),
            cudaErrorInvalidValue);
}

TEST(VocabObjectiveGpu, RecipeSizeStaysWithinOneGibAboveInputsAndOutputs) {
  REQUIRE_CUDA();
  const int64_t rows = 15360, hidden = 4096, vocab = 151936;
  auto in = random_inputs(rows, hidden, vocab, torch::kBFloat16);
  auto x = in.hidden.detach().clone().requires_grad_(true);
  VocabObjectiveOptions o;
  o.ce_weight = 0.1;
  o.top_k = 16;
  o.use_kernel = true;
  torch::cuda::synchronize();
  const auto device = c10::cuda::current_device();
  c10::cuda::CUDACachingAllocator::resetPeakStats(device);
  const auto before =
      c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].current;
  auto r = vocab_objective(x, in.teacher, in.labels, in.weights, in.lm_head, o);
  r.loss.backward();
  torch::cuda::synchronize();
  const auto peak = c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].peak;
  const int64_t outputs = rows * hidden * 2 /* dX */ + rows * (4 + 4 + 8 + 16 * 12);
  const double extra_gib = double(peak - before - outputs) / double(int64_t(1) << 30);
  std::printf("recipe-size fused vocabulary objective: %.3f GiB above inputs and outputs\n",
              extra_gib);
  EXPECT_LE(extra_gib, 1.0);
  EXPECT_TRUE(std::isfinite(r.loss.item<double>()));
  EXPECT_TRUE(torch::isfinite(x.grad()).all().item<bool>());
}

}  // namespace
}  // namespace dspine::ops
