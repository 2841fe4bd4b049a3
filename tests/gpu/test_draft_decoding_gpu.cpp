// The draft's decoding cache on CUDA (model/draft_decoding.h): with the fused kernels in bf16, a
// block drafted against the cache matches the training forward of that block over the whole
// context (whose attention runs through the block kernels), and in fp32 the cache gives on the GPU
// what it gives on the CPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "common/gpu_draft_config.h"
#include "common/parity.h"
#include "common/require_cuda.h"
#include "model/attention.h"
#include "model/draft_decoding.h"
#include "model/dspine_draft.h"

namespace dspine::model {
namespace {

DSpineModelConfig gpu_config() {
  auto c = testing::gpu_draft_config();
  c.fused_kernels = core::FusedKernels::kOn;
  return c;
}

struct Case {
  std::vector<int64_t> anchors = {5, 40, 17};
  at::Tensor hidden, ids, embed;  // CPU fp32
};

Case make_case(const DSpineModelConfig& c) {
  Case k;
  torch::manual_seed(41);
  k.hidden = torch::randn({3, 48, 2 * c.hidden_size});
  k.embed = torch::randn({c.vocab_size, c.hidden_size});
  k.ids = torch::full({3, c.block_size}, c.mask_token_id, torch::kInt64);
  k.ids.select(1, 0).copy_(torch::tensor({7, 8, 9}, torch::kInt64));
  return k;
}

DSpineDraft draft_on(const DSpineModelConfig& c, const torch::Device& device, torch::Dtype dtype) {
  torch::manual_seed(43);
  DSpineDraft draft(c, device.is_cuda() && c.fused_kernels == core::FusedKernels::kOn);
  draft->initialize_transfer_space(torch::randn({c.vocab_size, c.hidden_size}), 64);
  {
    torch::NoGradGuard no_grad;
    for (auto& w : draft->injection->write_layers) w->weight.normal_(0.0, 0.05);
  }
  place_draft(*draft, device, dtype);
  return draft;
}

at::Tensor cached(DSpineDraftImpl& draft, const Case& k, const torch::Device& device,
                  torch::Dtype dtype) {
  DraftDecodingCache cache(draft, 3, 64);
  cache.extend(k.hidden.narrow(1, 0, 30).to(device, dtype), {0, 0, 0});
  cache.extend(k.hidden.narrow(1, 30, 18).to(device, dtype), {30, 30, 30});
  const auto ids = k.ids.to(device);
  return cache.block(k.anchors, ids, torch::embedding(k.embed.to(device, dtype), ids))
      .hidden_states;
}

at::Tensor full(DSpineDraftImpl& draft, const Case& k, const torch::Device& device,
                torch::Dtype dtype) {
  torch::NoGradGuard no_grad;
  const int64_t seq = k.hidden.size(1), bs = draft.config().block_size;
  const auto anchor = torch::tensor(k.anchors, torch::kInt64).view({3, 1}).to(device);
  const auto positions =
      torch::cat({torch::arange(seq, anchor.options()).unsqueeze(0).expand({3, seq}),
                  anchor + torch::arange(bs, anchor.options())},
                 1);
  const auto ids = k.ids.to(device);
  return draft
      .forward(positions, anchor, torch::ones({3, 1}, anchor.options().dtype(torch::kBool)),
               torch::embedding(k.embed.to(device, dtype), ids), k.hidden.to(device, dtype),
               ids.view({3, 1, bs}), at::Tensor(), false)
      .hidden_states;
}

TEST(DraftDecodingCacheGpu, Bf16CacheMatchesTheBlockKernelsForward) {
  REQUIRE_CUDA();
  const auto c = gpu_config();
  const torch::Device cuda(torch::kCUDA);
  auto draft = draft_on(c, cuda, torch::kBFloat16);
  const auto k = make_case(c);
  const auto fused_input = torch::zeros(
      {3, 8, c.hidden_size}, torch::TensorOptions().dtype(torch::kBFloat16).device(cuda));
  ASSERT_TRUE(block_kernels_apply(c, true, fused_input)) << "the forward must take the kernels";
  const auto got = cached(*draft, k, cuda, torch::kBFloat16);
  const auto want = full(*draft, k, cuda, torch::kBFloat16);
  const double error = testing::norm_relative_error(got, want);
  EXPECT_LT(error, 2e-2);
  std::printf("bf16 cache vs block-kernel forward: relative error %.2e\n", error);
}

TEST(DraftDecodingCacheGpu, Fp32CacheOnTheGpuMatchesTheCpu) {
  REQUIRE_CUDA();
  const auto c = gpu_config();
  const torch::Device cuda(torch::kCUDA), cpu(torch::kCPU);
  const auto k = make_case(c);
  auto on_gpu = draft_on(c, cuda, torch::kFloat32);
  auto on_cpu = draft_on(c, cpu, torch::kFloat32);
  const auto got = cached(*on_gpu, k, cuda, torch::kFloat32);
  EXPECT_LT(testing::max_relative_diff(got, cached(*on_cpu, k, cpu, torch::kFloat32), 1.0), 1e-4);
  EXPECT_LT(testing::max_relative_diff(got, full(*on_cpu, k, cpu, torch::kFloat32), 1.0), 1e-4);
}

}  // namespace
}  // namespace dspine::model
