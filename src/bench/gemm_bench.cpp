// `dspine-bench gemm`: the recipe step's largest GEMMs (the MLP, attention and vocabulary
// projections at configs/qwen3-8b-dspine.yaml's shapes) in each of the three forms a linear layer
// runs (forward X·Wᵀ, input gradient dY·W, weight gradient dYᵀ·X), timed as ATen runs them
// (at::mm) and with every algorithm cuBLASLt's heuristic offers for them. The step's profile
// (scripts/profile_by_op.py --gemms) shows the backward forms well below the forward's rate; this
// says how much of that a different algorithm recovers. Each candidate's product is compared with
// at::mm's, so a layout mistake cannot pass as a fast algorithm; the fastest candidate is timed
// again after the others, and at::mm before and after them (the faster kept). Then the project's
// own GEMM (kernels/gemm_sm90.h) on the forward forms and the SwiGLU MLP's forward on it against
// cuBLAS and the separate passes. First of all, the GEMM rate under sustained load.
#include <ATen/cuda/CUDAContext.h>
#include <CLI/CLI.hpp>
#include <cublasLt.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "bench/cuda_timing.h"
#include "core/error.h"
#include "ops/gemm_ops.h"
#include "ops/swiglu_ops.h"

namespace dspine::bench {
namespace {

struct GemmOptions {
  int64_t tokens = 16384;  // draft rows of one micro-batch: 2 rows × 512 blocks × 16 slots
  int64_t hidden = 4096, intermediate = 12288, vocab = 151936, vocab_rows = 1024;
  int candidates = 16;  // algorithms asked of the heuristic per GEMM
  int iterations = 10;
  int64_t workspace_mib = 64;
};

// Row-major C[m, n] = op(A) · op(B): A is stored [m, k] (or [k, m] when a_transposed), B [k, n]
// (or [n, k] when b_transposed).
struct Product {
  std::string name;
  int64_t m, n, k;
  bool a_transposed, b_transposed;
};

std::vector<Product> recipe_products(const GemmOptions& o) {
  const int64_t t = o.tokens, h = o.hidden, i = o.intermediate;
  std::vector<Product> out;
  const auto linear = [&](const std::string& name, int64_t rows, int64_t in, int64_t outs) {
    out.push_back({name + " forward X·Wᵀ", rows, outs, in, false, true});
    out.push_back({name + " input grad dY·W", rows, in, outs, false, false});
    out.push_back({name + " weight grad dYᵀ·X", outs, in, rows, true, false});
  };
  linear("gate/up", t, h, 2 * i);
  linear("down", t, i, h);
  linear("q/o", t, h, h);
  out.push_back({"vocab logits R·Vᵀ", o.vocab_rows, o.vocab, h, false, true});
  out.push_back({"vocab input grad dL·V", o.vocab_rows, h, o.vocab, false, false});
  return out;
}

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    fail("dspine-bench gemm: {} failed: {}", what, cublasLtGetStatusString(status));
  }
}

// One product through cuBLASLt: the descriptors of its column-major mirror Cᵀ = op(B)ᵀ · op(A)ᵀ
// (a row-major [r, c] matrix is a column-major [c, r] one) and the heuristic's algorithms.
class LtProduct {
 public:
  LtProduct(const Product& p, int candidates, size_t workspace_bytes) {
    check(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    const cublasOperation_t first = p.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t second = p.a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &first, sizeof(first)),
          "TRANSA");
    check(
        cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &second, sizeof(second)),
        "TRANSB");
    // B's storage as column-major: [n, k] (ld n) or, transposed, [k, n] (ld k); likewise A.
    check(p.b_transposed ? cublasLtMatrixLayoutCreate(&b_, CUDA_R_16BF, p.k, p.n, p.k)
                         : cublasLtMatrixLayoutCreate(&b_, CUDA_R_16BF, p.n, p.k, p.n),
          "layout of B");
    check(p.a_transposed ? cublasLtMatrixLayoutCreate(&a_, CUDA_R_16BF, p.m, p.k, p.m)
                         : cublasLtMatrixLayoutCreate(&a_, CUDA_R_16BF, p.k, p.m, p.k),
          "layout of A");
    check(cublasLtMatrixLayoutCreate(&c_, CUDA_R_16BF, p.n, p.m, p.n), "layout of C");
    check(cublasLtMatmulPreferenceCreate(&preference_), "PreferenceCreate");
    check(
        cublasLtMatmulPreferenceSetAttribute(preference_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace_bytes, sizeof(workspace_bytes)),
        "workspace preference");
    results_.resize(static_cast<size_t>(candidates));
    int returned = 0;
    check(cublasLtMatmulAlgoGetHeuristic(at::cuda::getCurrentCUDABlasLtHandle(), desc_, b_, a_, c_,
                                         c_, preference_, candidates, results_.data(), &returned),
          "AlgoGetHeuristic");
    results_.resize(static_cast<size_t>(returned));
  }
  ~LtProduct() {
    cublasLtMatmulPreferenceDestroy(preference_);
    cublasLtMatrixLayoutDestroy(c_);
    cublasLtMatrixLayoutDestroy(a_);
    cublasLtMatrixLayoutDestroy(b_);
    cublasLtMatmulDescDestroy(desc_);
  }
  LtProduct(const LtProduct&) = delete;
  LtProduct& operator=(const LtProduct&) = delete;

  size_t count() const { return results_.size(); }

  void run(size_t candidate, const torch::Tensor& a, const torch::Tensor& b, torch::Tensor& c,
           torch::Tensor& workspace) const {
    const float one = 1.0f, zero = 0.0f;
    check(cublasLtMatmul(at::cuda::getCurrentCUDABlasLtHandle(), desc_, &one, b.data_ptr(), b_,
                         a.data_ptr(), a_, &zero, c.data_ptr(), c_, c.data_ptr(), c_,
                         &results_[candidate].algo, workspace.data_ptr(),
                         static_cast<size_t>(workspace.numel()), at::cuda::getCurrentCUDAStream()),
          "Matmul");
  }

 private:
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  cublasLtMatmulPreference_t preference_ = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> results_;
};

// The project's GEMM (ops/gemm_ops.h) on the forward forms X·Wᵀ, alone and with the residual
// added in its epilogue, against at::mm (and at::mm then the add); at::mm timed before and after.
void print_own_gemm(const GemmOptions& o) {
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  std::printf(
      "\nthe project's GEMM, forward forms (ops::linear_rows)\n\n"
      "| product | at::mm ms | own ms | own TFLOP/s | own / at::mm | at::mm + add ms | "
      "at::addmm ms | own + residual ms | max rel. diff |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Product& p : recipe_products(o)) {
    if (p.a_transposed || !p.b_transposed) continue;
    const auto x = torch::randn({p.m, p.k}, bf16), w = torch::randn({p.n, p.k}, bf16) * 0.02;
    const auto r = torch::randn({p.m, p.n}, bf16);
    if (!ops::own_gemm_takes(x, w, r)) {
      std::printf("| %s | (not taken on this device) | | | | | | | |\n", p.name.c_str());
      continue;
    }
    const auto reference = at::mm(x, w.t()).to(torch::kFloat);
    const double diff =
        ((ops::linear_rows(x, w).to(torch::kFloat) - reference).abs().max() / reference.abs().max())
            .item<double>();
    const auto time_aten = [&] {
      return cuda_median_ms([&] { at::mm(x, w.t()); }, 3, o.iterations);
    };
    double aten_ms = time_aten();
    const double own_ms = cuda_median_ms([&] { ops::linear_rows(x, w); }, 3, o.iterations);
    const double own_residual_ms =
        cuda_median_ms([&] { ops::linear_rows(x, w, r); }, 3, o.iterations);
    const double aten_add_ms = cuda_median_ms([&] { at::mm(x, w.t()).add_(r); }, 3, o.iterations);
    const double addmm_ms = cuda_median_ms([&] { at::addmm(r, x, w.t()); }, 3, o.iterations);
    aten_ms = std::min(aten_ms, time_aten());
    const double flop = 2.0 * double(p.m) * double(p.n) * double(p.k);
    std::printf("| %s | %.3f | %.3f | %.0f | %.3f | %.3f | %.3f | %.3f | %.1e |\n", p.name.c_str(),
                aten_ms, own_ms, flop / own_ms / 1e9, own_ms / aten_ms, aten_add_ms, addmm_ms,
                own_residual_ms, diff);
  }
}

// The SwiGLU MLP's forward with its residual at the recipe's size, three ways: cuBLAS for both
// products with the SwiGLU pass and the add; the decoder layers' path (cuBLAS gate/up, the SwiGLU
// pass, the down product on the project's GEMM with the residual in its epilogue); and one node on
// the project's GEMM (the activation and the add in its epilogues).
void print_mlp_forward(const GemmOptions& o) {
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  const auto x = torch::randn({o.tokens, o.hidden}, bf16), r = torch::randn_like(x);
  const auto gate_up_weight = torch::randn({2 * o.intermediate, o.hidden}, bf16) * 0.02;
  const auto down_weight = torch::randn({o.hidden, o.intermediate}, bf16) * 0.02;
  if (!ops::swiglu_mlp_fusable(x, gate_up_weight, down_weight, r)) {
    std::printf("\nSwiGLU MLP forward: the project's GEMM does not run on this device\n");
    return;
  }
  const auto separate = [&] {
    return ops::swiglu_down_fused(at::mm(x, gate_up_weight.t()), down_weight) + r;
  };
  const auto layers = [&] {
    return ops::swiglu_down_fused(at::mm(x, gate_up_weight.t()), down_weight, r);
  };
  const auto node = [&] { return ops::swiglu_mlp_fused(x, gate_up_weight, down_weight, r); };
  const auto reference = separate().to(torch::kFloat);
  const auto difference = [&](const at::Tensor& y) {
    return ((y.to(torch::kFloat) - reference).abs().max() / reference.abs().max()).item<double>();
  };
  const double layers_diff = difference(layers()), node_diff = difference(node());
  double separate_ms = cuda_median_ms([&] { separate(); }, 3, o.iterations);
  const double layers_ms = cuda_median_ms([&] { layers(); }, 3, o.iterations);
  const double node_ms = cuda_median_ms([&] { node(); }, 3, o.iterations);
  separate_ms = std::min(separate_ms, cuda_median_ms([&] { separate(); }, 3, o.iterations));
  std::printf(
      "\nSwiGLU MLP forward + residual, %ld x %ld, I %ld\n\n"
      "| path | ms | / cuBLAS path | max rel. diff |\n|---|---:|---:|---:|\n"
      "| cuBLAS both products, SwiGLU pass, add | %.3f | 1.000 | |\n"
      "| decoder layers: residual in the own down GEMM | %.3f | %.3f | %.1e |\n"
      "| one node on the own GEMM (SwiGLU and residual epilogues) | %.3f | %.3f | %.1e |\n",
      long(o.tokens), long(o.hidden), long(o.intermediate), separate_ms, layers_ms,
      layers_ms / separate_ms, layers_diff, node_ms, node_ms / separate_ms, node_diff);
}

// The GEMM rate under sustained load: after two idle seconds, the MLP's gate/up forward product
// back to back for about two seconds, each call timed. The first calls run at the clocks a short
// burst gets (what bf16_gemm_tflops measures), the last at those the GPU holds under GEMM load.
void print_sustained_rate(const GemmOptions& o) {
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  const auto x = torch::randn({o.tokens, o.hidden}, bf16);
  const auto w = torch::randn({2 * o.intermediate, o.hidden}, bf16) * 0.02;
  const double flop = 2.0 * double(o.tokens) * double(o.hidden) * double(2 * o.intermediate);
  constexpr int kCalls = 400, kGroup = 40;
  torch::cuda::synchronize();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  std::vector<double> ms = cuda_each_ms([&] { at::mm(x, w.t()); }, kCalls);
  std::printf(
      "sustained GEMM rate: %d back-to-back gate/up forward products (%ld x %ld x %ld, at::mm) "
      "after 2 s idle\n\n| calls | median ms | TFLOP/s |\n|---|---:|---:|\n",
      kCalls, long(o.tokens), long(2 * o.intermediate), long(o.hidden));
  for (int first = 0; first < kCalls; first += kGroup) {
    std::vector<double> group(ms.begin() + first, ms.begin() + first + kGroup);
    std::nth_element(group.begin(), group.begin() + kGroup / 2, group.end());
    const double median = group[kGroup / 2];
    std::printf("| %d-%d | %.3f | %.0f |\n", first + 1, first + kGroup, median,
                flop / median / 1e9);
  }
  std::printf("\n");
}

void run_gemm_bench(const GemmOptions& o) {
  if (!torch::cuda::is_available()) fail("dspine-bench gemm needs a CUDA device");
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  auto workspace = torch::empty({o.workspace_mib << 20},
                                torch::TensorOptions().dtype(torch::kUInt8).device(torch::kCUDA));
  print_sustained_rate(o);
  const double rate = bf16_gemm_tflops();
  std::printf("bf16 GEMM rate (16384 x 4096 x 12288, at::mm): %.1f TFLOP/s\n\n", rate);
  std::printf(
      "| product | m x n x k | at::mm ms | TFLOP/s | heuristic's first ms | best of %d ms (index) "
      "| best TFLOP/s | best / at::mm | max rel. diff "
      "|\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
      o.candidates);
  for (const Product& p : recipe_products(o)) {
    // Operands of a trained layer's scale: unit activations and gradients, 0.02 weights.
    auto a = torch::randn(
        p.a_transposed ? std::vector<int64_t>{p.k, p.m} : std::vector<int64_t>{p.m, p.k}, bf16);
    auto b = torch::randn(
                 p.b_transposed ? std::vector<int64_t>{p.n, p.k} : std::vector<int64_t>{p.k, p.n},
                 bf16) *
             0.02;
    const auto op_a = p.a_transposed ? a.t() : a;
    const auto op_b = p.b_transposed ? b.t() : b;
    const auto reference = at::mm(op_a, op_b).to(torch::kFloat);
    const auto reference_max = reference.abs().max();
    const double flop = 2.0 * double(p.m) * double(p.n) * double(p.k);
    // at::mm is timed before and after the candidates, the faster kept: a drift of the clocks
    // over the candidates cannot favour them.
    const auto time_aten = [&] {
      return cuda_median_ms([&] { at::mm(op_a, op_b); }, 3, o.iterations);
    };
    double aten_ms = time_aten();

    const LtProduct lt(p, o.candidates, static_cast<size_t>(workspace.numel()));
    if (lt.count() == 0) {
      std::printf("| %s | %ld x %ld x %ld | %.3f | %.0f | (no algorithm) | | | | |\n",
                  p.name.c_str(), long(p.m), long(p.n), long(p.k), aten_ms, flop / aten_ms / 1e9);
      continue;
    }
    auto c = torch::empty({p.m, p.n}, bf16);
    double first_ms = 0, best_ms = 1e30, worst_diff = 0;
    size_t best = 0;
    for (size_t i = 0; i < lt.count(); ++i) {
      lt.run(i, a, b, c, workspace);
      const double diff =
          ((c.to(torch::kFloat) - reference).abs().max() / reference_max).item<double>();
      worst_diff = std::max(worst_diff, diff);
      const double ms = cuda_median_ms([&] { lt.run(i, a, b, c, workspace); }, 2, o.iterations);
      if (i == 0) first_ms = ms;
      if (ms < best_ms) {
        best_ms = ms;
        best = i;
      }
    }
    aten_ms = std::min(aten_ms, time_aten());
    // The fastest of many noisy medians is biased low: the chosen algorithm is timed once more.
    best_ms = cuda_median_ms([&] { lt.run(best, a, b, c, workspace); }, 2, o.iterations);
    std::printf("| %s | %ld x %ld x %ld | %.3f | %.0f | %.3f | %.3f (%zu) | %.0f | %.3f | %.1e |\n",
                p.name.c_str(), long(p.m), long(p.n), long(p.k), aten_ms, flop / aten_ms / 1e9,
                first_ms, best_ms, best, flop / best_ms / 1e9, best_ms / aten_ms, worst_diff);
  }
  print_own_gemm(o);
  print_mlp_forward(o);
}

}  // namespace

void register_gemm_bench(CLI::App& app) {
  auto o = std::make_shared<GemmOptions>();
  auto* cmd = app.add_subcommand(
      "gemm", "the recipe step's largest GEMMs: at::mm against each cuBLASLt algorithm offered");
  cmd->add_option("--tokens", o->tokens, "draft rows of a micro-batch (B·N·bs)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--hidden", o->hidden, "hidden size")->check(CLI::PositiveNumber);
  cmd->add_option("--intermediate", o->intermediate, "MLP intermediate size")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--vocab", o->vocab, "vocabulary size")->check(CLI::PositiveNumber);
  cmd->add_option("--vocab-rows", o->vocab_rows, "proposal rows per vocabulary chunk")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--candidates", o->candidates, "algorithms asked of the heuristic per GEMM")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--iters", o->iterations, "timed calls (the median is reported)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--workspace-mib", o->workspace_mib, "cuBLASLt workspace in MiB")
      ->check(CLI::Range(0, 4096));
  cmd->callback([o] { run_gemm_bench(*o); });
}

}  // namespace dspine::bench
