// The GSPO update's policy loss on CUDA: the fused shared-row path against the chunked reference
// (vocabulary rows shared by G samples, and the refinement head's k-column rows), and the memory
// claim: no fp32 [rows, V] tensor, only the bf16 gradient beside the logits.
#include <gtest/gtest.h>

#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/torch.h>

#include "common/policy_case.h"
#include "common/require_cuda.h"
#include "dist/communicator.h"
#include "objectives/gspo_policy_loss.h"
#include "ops/vocab_objective_ops.h"

namespace dspine::objectives {
namespace {

// Blocks of `slots` rows, G samples per row, segment (block, sample); block 0's last slot masked.
GspoPolicySamples samples(int64_t blocks, int64_t slots, int64_t group, int64_t vocab,
                          const torch::Device& device) {
  torch::manual_seed(4);
  const int64_t rows = blocks * slots;
  GspoPolicySamples s;
  s.targets = torch::randint(0, vocab, {rows, group}, torch::kInt64);
  if (group > 1) s.targets.select(1, 1).copy_(s.targets.select(1, 0));  // a repeated token
  s.targets[slots - 1].fill_(-100);
  s.old_logprobs = -torch::rand({rows, group}) * 4 - 6;
  s.advantages = torch::randn({blocks, 1, group}).expand({blocks, slots, group}).reshape({rows, group});
  s.segments = torch::arange(blocks * group).view({blocks, 1, group}).expand({blocks, slots, group})
                   .reshape({rows, group});
  auto counts = torch::full({blocks}, slots, torch::kInt64);
  counts[0] = slots - 1;
  s.label_counts = counts.view({blocks, 1, 1}).expand({blocks, slots, group}).reshape({rows, group});
  s.seam_order = torch::arange(rows * group).view({blocks, slots, group}).permute({0, 2, 1}).reshape(-1);
  s.num_segments = blocks * group;
  for (auto* t : {&s.targets, &s.old_logprobs, &s.advantages, &s.segments, &s.label_counts,
                  &s.seam_order}) {
    *t = t->to(device).contiguous();
  }
  return s;
}

GspoSeamParams params() {
  GspoSeamParams p;
  p.logits_scale = 0.9;
  p.eps_low = 0.2;
  p.eps_high = 0.25;
  p.divisor = 37;
  return p;
}

void expect_fused_matches_reference(int64_t vocab, int64_t group, torch::Dtype dtype) {
  auto comm = dist::make_single_process_communicator();
  const torch::Device cuda(torch::kCUDA);
  auto s = samples(6, 15, group, vocab, cuda);
  torch::manual_seed(9);
  auto base = (torch::randn({6 * 15, vocab}) * 3).to(cuda, dtype);
  auto run = [&](GspoBackend backend) {
    auto logits = base.clone().requires_grad_();
    auto out = gspo_policy_loss(logits, s, params(), *comm, backend);
    out.loss.backward();
    return std::make_pair(out, logits.grad().to(torch::kFloat32));
  };
  auto [fused, fused_grad] = run(GspoBackend::kFused);
  auto [reference, reference_grad] = run(GspoBackend::kReference);
  const double tol = dtype == torch::kFloat32 ? 1e-5 : 5e-3;
  const std::string what = "V " + std::to_string(vocab) + " G " + std::to_string(group);
  EXPECT_NEAR(fused.loss.item<double>(), reference.loss.item<double>(), tol) << what;
  EXPECT_NEAR(fused.seam.ratio_mean.item<double>(), reference.seam.ratio_mean.item<double>(), tol)
      << what;
  // Same segments clipped; the fraction's sum differs only in fp32 summation order.
  EXPECT_NEAR(fused.seam.clipped_fraction.item<double>(),
              reference.seam.clipped_fraction.item<double>(), 1e-6)
      << what;
  EXPECT_TRUE(torch::allclose(fused.logprobs, reference.logprobs, tol, tol)) << what;
  const double scale = reference_grad.abs().max().item<double>();
  EXPECT_LT((fused_grad - reference_grad).abs().max().item<double>(), tol * std::max(scale, 1e-3))
      << what;
}

TEST(GspoPolicyGpu, SharedVocabularyRowsMatchReference) {
  REQUIRE_CUDA();
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    expect_fused_matches_reference(32000, 4, dtype);
    expect_fused_matches_reference(151936, 2, dtype);
  }
}

TEST(GspoPolicyGpu, RefinementCandidateRowsMatchReference) {
  REQUIRE_CUDA();
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) expect_fused_matches_reference(16, 1, dtype);
}

TEST(GspoPolicyGpu, UpdateHoldsNoFp32RowsByVocabulary) {
  REQUIRE_CUDA();
  auto comm = dist::make_single_process_communicator();
  const torch::Device cuda(torch::kCUDA);
  const int64_t blocks = 256, slots = 15, vocab = 151936;
  auto s = samples(blocks, slots, 4, vocab, cuda);
  auto logits = torch::randn({blocks * slots, vocab}, torch::dtype(torch::kBFloat16).device(cuda))
                    .requires_grad_();
  torch::cuda::synchronize();
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  const auto before = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current;
  auto out = gspo_policy_loss(logits, s, params(), *comm, GspoBackend::kFused);
  out.loss.backward();
  torch::cuda::synchronize();
  const auto peak = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].peak;
  const double rows_by_vocab = static_cast<double>(blocks * slots * vocab);
  const double extra = static_cast<double>(peak - before);
  // The bf16 gradient (2 bytes per logit) plus per-row vectors; one fp32 copy would add 4.
  EXPECT_LT(extra, rows_by_vocab * 2 + (64 << 20)) << "extra " << extra / (1 << 20) << " MiB";
}

// The policy term in the vocabulary row pass (GEMM per chunk, the GSPO vocab kernels, the fused
// seam) against projecting every logit and the reference seam, both on the GPU: values and the
// hidden states' gradient, fp32 and bf16, several chunks.
TEST(GspoPolicyGpu, RowPassPolicyMatchesReference) {
  REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA);
  const int64_t blocks = 12, slots = 16, group = 4, vocab = 151936, width = 256;
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const auto policy = testing::policy_case(blocks, slots, group, vocab, cuda);
    torch::manual_seed(3);
    auto hidden = (torch::randn({blocks * slots, width}) * 0.5).to(cuda, dtype);
    auto head = (torch::randn({vocab, width}) * 0.2).to(cuda, dtype);
    auto [row, ref] =
        testing::policy_alone(policy, hidden, head, 5 * slots, GspoBackend::kReference);
    const double tol = dtype == torch::kFloat32 ? 2e-5 : 1e-2;
    const std::string what = dtype == torch::kFloat32 ? "fp32" : "bf16";
    EXPECT_NEAR(row.loss, ref.loss, tol * (1 + std::abs(ref.loss))) << what;
    EXPECT_NEAR(row.ratio_mean, ref.ratio_mean, tol) << what;
    EXPECT_NEAR(row.clipped_fraction, ref.clipped_fraction, 1e-6) << what;
    const double logprob_error = (row.logprobs - ref.logprobs).abs().max().item<double>();
    EXPECT_LT(logprob_error, dtype == torch::kFloat32 ? 1e-4 : 1e-2) << what;
    const double scale = ref.grad.abs().max().item<double>();
    const double grad_error = (row.grad - ref.grad).abs().max().item<double>();
    EXPECT_LT(grad_error, tol * scale) << what;
    std::printf(
        "row pass vs reference %s: loss %.3e, log-prob max diff %.3e, grad max diff "
        "%.3e of %.3e\n",
        what.c_str(), std::abs(row.loss - ref.loss), logprob_error, grad_error, scale);
  }
}

// The policy term beside the supervised terms at logits scale 1, as the GSPO update with
// ce_weight > 0 runs it: the row kernel folds the policy gradient into its own pass against the
// ATen row pass, which writes it aside and adds it (the reference seam); values and the hidden
// states' gradient, fp32 and bf16, several chunks.
TEST(GspoPolicyGpu, RowPassFoldsThePolicyIntoTheSupervisedGradient) {
  REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA);
  const int64_t blocks = 12, slots = 16, group = 4, vocab = 151936, width = 256;
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto policy = testing::policy_case(blocks, slots, group, vocab, cuda);
    policy.logits_scale = 1.0;
    policy.loss_scale = 3.0;
    torch::manual_seed(3);
    const int64_t rows = blocks * slots;
    auto hidden = (torch::randn({rows, width}) * 0.5).to(cuda, dtype);
    auto teacher = (torch::randn({rows, width}) * 0.5).to(cuda, dtype);
    auto head = (torch::randn({vocab, width}) * 0.2).to(cuda, dtype);
    auto labels = torch::randint(0, vocab, {rows}, torch::dtype(torch::kInt64).device(cuda));
    auto weights = torch::rand({rows}, torch::device(cuda));
    auto run = [&](bool kernel, ops::GspoBackend backend) {
      policy.backend = backend;
      ops::VocabObjectiveOptions options;
      options.ce_weight = 0.1;
      options.chunk_rows = 5 * slots;
      options.use_kernel = kernel;
      options.policy = &policy;
      auto h = hidden.detach().clone().requires_grad_();
      auto out = ops::vocab_objective(h, teacher, labels, weights, head, options);
      out.loss.backward();
      return std::make_pair(out, h.grad().to(torch::kFloat32));
    };
    auto [fused, fused_grad] = run(true, ops::GspoBackend::kFused);
    auto [ref, ref_grad] = run(false, ops::GspoBackend::kReference);
    const std::string what = dtype == torch::kFloat32 ? "fp32" : "bf16";
    const double tol = dtype == torch::kFloat32 ? 2e-5 : 1e-2;
    // dX sums the row gradient over 151,936 columns; the kernel's fast exponential and its single
    // rounding differ from ATen's in the last bits of each column (fp32: 3e-5 of the largest).
    const double grad_tol = dtype == torch::kFloat32 ? 1e-4 : 1e-2;
    const double loss = ref.loss.item<double>();
    EXPECT_NEAR(fused.loss.item<double>(), loss, tol * (1 + std::abs(loss))) << what;
    EXPECT_NEAR(fused.policy.loss.item<double>(), ref.policy.loss.item<double>(), tol) << what;
    EXPECT_NEAR(fused.policy.clipped_fraction.item<double>(),
                ref.policy.clipped_fraction.item<double>(), 1e-6)
        << what;
    const double logprob_error =
        (fused.policy.logprobs - ref.policy.logprobs).abs().max().item<double>();
    EXPECT_LT(logprob_error, dtype == torch::kFloat32 ? 1e-4 : 1e-2) << what;
    const double scale = ref_grad.abs().max().item<double>();
    const double grad_error = (fused_grad - ref_grad).abs().max().item<double>();
    const double cosine =
        torch::cosine_similarity(fused_grad.flatten(), ref_grad.flatten(), 0).item<double>();
    EXPECT_LT(grad_error, grad_tol * scale) << what;
    EXPECT_GE(cosine, dtype == torch::kFloat32 ? 0.999999 : 0.9999) << what;
    std::printf(
        "row pass with supervised terms, policy folded vs reference %s: loss %.3e, log-prob max "
        "diff %.3e, grad max diff %.3e of %.3e, cosine %.8f\n",
        what.c_str(), std::abs(fused.loss.item<double>() - loss), logprob_error, grad_error, scale,
        cosine);
  }
}

// The row pass's update holds no [rows, V] tensor: at the recipe's vocabulary, 3,072 rows, its
// peak above the inputs stays within one chunk of logits and its gradient buffer's rows.
TEST(GspoPolicyGpu, RowPassHoldsOneChunkOfLogits) {
  REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA);
  const int64_t blocks = 192, slots = 16, group = 4, vocab = 151936, width = 1024;
  const auto policy = testing::policy_case(blocks, slots, group, vocab, cuda);
  auto hidden = torch::randn({blocks * slots, width}, torch::dtype(torch::kBFloat16).device(cuda))
                    .requires_grad_();
  auto head = torch::randn({vocab, width}, torch::dtype(torch::kBFloat16).device(cuda)) * 0.05;
  ops::VocabObjectiveOptions options;
  options.chunk_rows = 512;
  options.policy = &policy;
  torch::cuda::synchronize();
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  const auto before = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current;
  auto out = ops::vocab_policy_objective(hidden, head, options);
  out.loss.backward();
  torch::cuda::synchronize();
  const auto peak = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].peak;
  const double chunk_logits = 512.0 * vocab * 2;
  const double rows_by_vocab = static_cast<double>(blocks * slots) * vocab * 2;
  const double extra = static_cast<double>(peak - before);
  EXPECT_LT(extra, chunk_logits + (64 << 20)) << "extra " << extra / (1 << 20) << " MiB";
  EXPECT_LT(extra, rows_by_vocab / 4);
}

}  // namespace
}  // namespace dspine::objectives
