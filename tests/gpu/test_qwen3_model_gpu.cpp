// Qwen3Model on CUDA: the same checkpoint loaded on the GPU (fp32 and bf16) matches the CPU fp32
// forward, cached decoding and branches of the cache match the full forward there too, the fused
// kernels of a bf16 model match HF's ATen composition, and an 8B-shaped random target runs in
// bf16 (its time is printed for docs/benchmarks.md).
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/parity.h"
#include "core/files.h"
#include "core/safetensors.h"
#include "target/qwen3_model.h"
#include "data/target_source.h"

namespace dspine::data {
namespace {

using target::Qwen3Dims;
using target::Qwen3Model;

namespace fs = std::filesystem;

// An empty temporary directory `name` holding only config.json.
fs::path model_directory(const std::string& name, const std::string& config_json) {
  const fs::path dir = fs::temp_directory_path() / name;
  core::remove_tree(dir.string());
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config_json;
  return dir;
}

// A tiny random Qwen3 checkpoint written as a HF directory (untied, GQA 4/2, head_dim 16).
std::string write_checkpoint() {
  const fs::path dir = model_directory("dspine_qwen3_gpu", R"({"model_type": "qwen3",
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 120, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "tie_word_embeddings": false})");
  torch::manual_seed(3);
  core::NamedTensors tensors = {{"model.embed_tokens.weight", torch::randn({120, 64})},
                                {"model.norm.weight", 1 + 0.2 * torch::randn({64})},
                                {"lm_head.weight", 0.2 * torch::randn({120, 64})}};
  for (int l = 0; l < 3; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"self_attn.q_proj.weight", {64, 64}}, {"self_attn.k_proj.weight", {32, 64}},
             {"self_attn.v_proj.weight", {32, 64}}, {"self_attn.o_proj.weight", {64, 64}},
             {"mlp.gate_proj.weight", {96, 64}}, {"mlp.up_proj.weight", {96, 64}},
             {"mlp.down_proj.weight", {64, 96}}}) {
      tensors.emplace_back(p + name, 0.15 * torch::randn(shape));
    }
    for (const auto& [name, size] : std::vector<std::pair<std::string, int64_t>>{
             {"self_attn.q_norm.weight", 16}, {"self_attn.k_norm.weight", 16},
             {"input_layernorm.weight", 64}, {"post_attention_layernorm.weight", 64}}) {
      tensors.emplace_back(p + name, 1 + 0.2 * torch::randn({size}));
    }
  }
  core::save_safetensors((dir / "model.safetensors").string(), tensors);
  return dir.string();
}

TEST(Qwen3ModelGpu, CudaForwardMatchesCpuInFp32AndBf16) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = write_checkpoint();
  const auto ids = torch::randint(120, {2, 37}, torch::kLong);
  const std::vector<int64_t> layers = {0, 2};
  const auto cpu = Qwen3Model::load_hf(dir, torch::kFloat, torch::kCPU).forward(ids, layers);
  const torch::Device cuda(torch::kCUDA, 0);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto model = Qwen3Model::load_hf(dir, dtype, cuda);
    const auto out = model.forward(ids, layers);
    EXPECT_TRUE(out.hidden_states.is_cuda());
    const double tolerance = dtype == torch::kFloat ? 1e-4 : 5e-2;
    const std::string what = c10::toString(dtype);
    testing::expect_close(out.hidden_states, cpu.hidden_states, tolerance, what);
    testing::expect_close(out.last_hidden_state, cpu.last_hidden_state, tolerance, what);

    auto cache = model.new_cache(2, 37);
    std::vector<torch::Tensor> last;
    last.push_back(model.step(ids.narrow(1, 0, 30), cache).last_hidden_state);
    last.push_back(model.step(ids.narrow(1, 30, 5), cache).last_hidden_state);
    last.push_back(model.step(ids.narrow(1, 35, 1), cache).last_hidden_state);
    last.push_back(model.step(ids.narrow(1, 36, 1), cache).last_hidden_state);
    testing::expect_close(torch::cat(last, 1), out.last_hidden_state, tolerance, what + " cached");
  }
  core::remove_tree(dir);
}

// Branches of the cache (what the acceptance evaluation's verifier runs) on CUDA, fp32 and bf16,
// against the CPU fp32 forward over each context prefix followed by its block.
TEST(Qwen3ModelGpu, CacheBranchesMatchTheCpuForward) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = write_checkpoint();
  torch::manual_seed(4);
  const auto ids = torch::randint(120, {2, 37}, torch::kLong);
  const auto drafted = torch::randint(120, {2, 3, 5}, torch::kLong);
  const auto context = torch::tensor(std::vector<int64_t>{1, 20, 37, 37, 9, 2}).view({2, 3});
  const auto cpu = Qwen3Model::load_hf(dir, torch::kFloat, torch::kCPU);
  const torch::Device cuda(torch::kCUDA, 0);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto model = Qwen3Model::load_hf(dir, dtype, cuda);
    auto cache = model.new_cache(2, 37);
    model.step(ids, cache);
    const auto states = model.branch(drafted, context, cache);
    EXPECT_TRUE(states.is_cuda());
    const double tolerance = dtype == torch::kFloat ? 1e-4 : 5e-2;
    for (int64_t r = 0; r < 2; ++r) {
      for (int64_t n = 0; n < 3; ++n) {
        const int64_t prefix = context[r][n].item<int64_t>();
        const auto sequence = torch::cat({ids[r].narrow(0, 0, prefix), drafted[r][n]}).unsqueeze(0);
        const auto reference = cpu.forward(sequence, {}).last_hidden_state[0].narrow(0, prefix, 5);
        testing::expect_close(
            states[r][n], reference, tolerance,
            std::string(c10::toString(dtype)) + " " + std::to_string(r) + std::to_string(n));
      }
    }
  }
  core::remove_tree(dir);
}

// The fused kernels (norms, q/k norm + RoPE at head_dim 128, add + norm, SwiGLU) against HF's ATen
// composition in bf16, both measured against the same model in fp32: the fused forward is no
// farther from it than the composition is (each rounds in bf16), for the whole sequence, cached
// steps and branches of the cache.
TEST(Qwen3ModelGpu, FusedKernelsMatchTheAtenCompositionInBf16) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Qwen3Dims dims{512, 1024, 3, 8, 2, 128, 1000, 1e-6, 1e6, false};
  const torch::Device cuda(torch::kCUDA, 0);
  auto fused = Qwen3Model::random(dims, 5, torch::kBFloat16, cuda);
  auto composed = Qwen3Model::random(dims, 5, torch::kBFloat16, cuda);
  const auto oracle = Qwen3Model::random(dims, 5, torch::kFloat, cuda);
  ASSERT_TRUE(fused.fused_kernels());
  EXPECT_FALSE(oracle.fused_kernels());
  EXPECT_FALSE(Qwen3Model::random(dims, 5, torch::kBFloat16, torch::kCPU).fused_kernels());
  composed.use_fused_kernels(false);
  torch::manual_seed(6);
  const auto ids = torch::randint(dims.vocab_size, {2, 96}, torch::kLong);
  const auto drafted = torch::randint(dims.vocab_size, {2, 3, 8}, torch::kLong);
  const auto context = torch::tensor(std::vector<int64_t>{1, 40, 96, 96, 9, 2}).view({2, 3});
  struct Run {
    torch::Tensor hidden, last, cached, branches;
  };
  const auto run = [&](const Qwen3Model& model) {
    Run out;
    const auto whole = model.forward(ids, {0, 2});
    out.hidden = whole.hidden_states.to(torch::kFloat);
    out.last = whole.last_hidden_state.to(torch::kFloat);
    auto cache = model.new_cache(2, 96);
    const auto first = model.step(ids.narrow(1, 0, 60), cache).last_hidden_state;
    const auto rest = model.step(ids.narrow(1, 60, 36), cache).last_hidden_state;
    out.cached = torch::cat({first, rest}, 1).to(torch::kFloat);
    out.branches = model.branch(drafted, context, cache).to(torch::kFloat);
    return out;
  };
  const Run a = run(fused), b = run(composed), truth = run(oracle);
  const auto pairs = {std::tuple{"hidden states", a.hidden, b.hidden, truth.hidden},
                      std::tuple{"last hidden state", a.last, b.last, truth.last},
                      std::tuple{"cached steps", a.cached, b.cached, truth.cached},
                      std::tuple{"branches", a.branches, b.branches, truth.branches}};
  for (const auto& [what, got, composition, expected] : pairs) {
    const double mine = testing::norm_relative_error(got, expected);
    const double theirs = testing::norm_relative_error(composition, expected);
    std::printf("%s against fp32: fused %.3g, ATen composition %.3g\n", what, mine, theirs);
    EXPECT_LE(mine, 1.25 * theirs + 1e-4) << what;
    EXPECT_GE(testing::cosine(got, composition), 0.9999) << what;
  }
}

TEST(Qwen3ModelGpu, EightBShapedRandomTargetRunsInBf16) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // Qwen3-8B's shape.
  const Qwen3Dims dims{4096, 12288, 36, 32, 8, 128, 151936, 1e-6, 1e6, false};
  const torch::Device cuda(torch::kCUDA, 0);
  const auto model = Qwen3Model::random(dims, 1, torch::kBFloat16, cuda);
  const auto ids = torch::randint(dims.vocab_size, {1, 4096}, torch::kLong);
  const std::vector<int64_t> layers = {1, 9, 17, 25, 33};
  model.forward(ids, layers);  // warm-up
  torch::cuda::synchronize();
  const auto start = std::chrono::steady_clock::now();
  const auto out = model.forward(ids, layers);
  torch::cuda::synchronize();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("8B-shaped bf16 forward, 1 x 4096 tokens, 5 layers captured: %.1f ms (%.0f tokens/s)\n",
              ms, 4096 / ms * 1e3);
  EXPECT_EQ(out.hidden_states.sizes(), torch::IntArrayRef({1, 4096, 5 * 4096}));
  EXPECT_TRUE(torch::isfinite(out.last_hidden_state).all().item<bool>());
  EXPECT_TRUE(torch::isfinite(model.logits(out.last_hidden_state.narrow(1, 0, 8))).all().item<bool>());
}

// The online target computing the next batches ahead on its own stream (data.target.prefetch):
// each batch is bit for bit the one computed on the caller's stream, also while the caller's
// stream works on the previous batch and frees it (the side stream's memory must not be reused
// before the caller is done with it).
TEST(Qwen3ModelGpu, TargetBatchesComputedAheadOnTheirStreamAreTheSameBits) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const fs::path dir = model_directory("dspine_target_prefetch_gpu", R"({"model_type": "qwen3",
    "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 1000,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": false})");
  core::Config c;
  c.model.hidden_size = 512;
  c.model.vocab_size = 1000;
  c.model.target_layer_ids = {1, 3};
  c.training.dtype = core::Dtype::kBf16;
  c.data.source = core::DataSource::kTarget;
  c.data.seq_len = 1024;
  c.data.target.path = dir.string();
  c.data.target.random = true;
  const torch::Device cuda(torch::kCUDA, 0);
  TargetSource ahead(c.data, c.model, target_dtype(c.training.dtype, cuda), cuda);
  c.data.target.prefetch = false;
  TargetSource plain(c.data, c.model, target_dtype(c.training.dtype, cuda), cuda);
  const int64_t rows = 2;
  ahead.prefetch(0, rows);
  for (int64_t step = 0; step < 6; ++step) {
    ahead.seek(step * rows);
    DraftBatch a = ahead.next(rows);
    ahead.prefetch((step + 1) * rows, rows);
    // The caller's stream keeps working on the batch while the next one is computed.
    const auto states = a.hidden_states.flatten(0, 1).to(torch::kFloat);
    const auto busy = torch::mm(states, states.t());
    const auto a_sum = a.hidden_states.to(torch::kFloat).sum(-1);
    plain.seek(step * rows);
    const DraftBatch b = plain.next(rows);
    EXPECT_TRUE(torch::equal(a.input_ids, b.input_ids)) << "step " << step;
    EXPECT_TRUE(torch::equal(a.hidden_states, b.hidden_states)) << "step " << step;
    EXPECT_TRUE(torch::equal(a.target_last_hidden_states, b.target_last_hidden_states))
        << "step " << step;
    EXPECT_TRUE(torch::equal(a_sum, b.hidden_states.to(torch::kFloat).sum(-1))) << "step " << step;
    a = DraftBatch{};  // freed while the caller's stream may still be reading it
    EXPECT_TRUE(torch::isfinite(busy).all().item<bool>());
  }
  EXPECT_EQ(ahead.batches_ahead(), 1u);
  core::remove_tree(dir.string());
}

}  // namespace
}  // namespace dspine::data
