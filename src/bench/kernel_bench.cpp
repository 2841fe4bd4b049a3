// `dspine-bench kernels`: RMSNorm, add+RMSNorm and SwiGLU — the ATen reference (eager, as the
// reference modules run it), ATen's own rms_norm, and the fused kernels — over a list of shapes;
// or, with --in/--out, one kernel on tensors from a safetensors file, outputs and gradients
// written back for comparison with other implementations.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/cuda/CUDAContext.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include "bench/bench.h"
#include "bench/cuda_timing.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "ops/rms_norm_ops.h"
#include "ops/swiglu_ops.h"

namespace dspine::bench {
namespace {

using Tensors = std::vector<torch::Tensor>;

struct Options {
  std::vector<std::string> kernels{"rms_norm", "add_rms_norm", "swiglu"};
  std::vector<std::string> shapes;  // "ROWSxCOLS"; empty: each kernel's defaults
  std::string dtype = "bf16";
  int warmup = 10;
  int iterations = 50;
  double eps = 1e-6;
  std::string csv, in, out, impl = "fused";
};

// Liger-Kernel's published shape (2048 x 4096), ours at 16384 rows (2 x 512 x 16 tokens,
// H = 4096, I = 12288), and the tiny CPU config (2 x 64 tokens, H = 64, I = 128).
const std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> kDefaultShapes = {
    {"rms_norm", {{2048, 4096}, {16384, 4096}, {128, 64}}},
    {"add_rms_norm", {{2048, 4096}, {16384, 4096}, {128, 64}}},
    {"swiglu", {{2048, 4096}, {16384, 12288}, {128, 128}}},
};

// One kernel: its inputs (names as in --in files), outputs, and bytes each pass must move.
struct Kernel {
  std::vector<std::string> input_names;   // differentiable inputs first
  std::vector<std::string> output_names;  // forward outputs; gradients are named d<input>
  std::vector<std::string> impls;
  std::function<Tensors(const std::string& impl, const Tensors& inputs, double eps)> forward;
  // Bytes read + written by the forward and the backward (element size `e`).
  std::function<double(int64_t rows, int64_t cols, double e)> forward_bytes, backward_bytes;
  // Input shapes for rows x cols.
  std::function<std::vector<std::vector<int64_t>>(int64_t rows, int64_t cols)> input_shapes;
};

std::map<std::string, Kernel> kernels() {
  std::map<std::string, Kernel> k;
  k["rms_norm"] =
      Kernel{{"x", "weight"},
             {"y"},
             {"reference", "aten", "fused"},
             [](const std::string& impl, const Tensors& in, double eps) -> Tensors {
               if (impl == "reference") return {ops::rms_norm_reference(in[0], in[1], eps)};
               if (impl == "aten") return {at::rms_norm(in[0], {in[0].size(-1)}, in[1], eps)};
               return {ops::rms_norm_fused(in[0], in[1], eps)};
             },
             // x, weight in; y, rstd out.
             [](int64_t r, int64_t c, double e) { return 2.0 * r * c * e + c * e + 4.0 * r; },
             // dy, x, weight, rstd in; dx, dweight out.
             [](int64_t r, int64_t c, double e) { return 3.0 * r * c * e + 2.0 * c * e + 4.0 * r; },
             [](int64_t r, int64_t c) {
               return std::vector<std::vector<int64_t>>{{r, c}, {c}};
             }};
  k["add_rms_norm"] = Kernel{
      {"x", "residual", "weight"},
      {"sum", "y"},
      {"reference", "fused"},
      [](const std::string& impl, const Tensors& in, double eps) -> Tensors {
        auto [sum, y] = impl == "reference" ? ops::add_rms_norm_reference(in[0], in[1], in[2], eps)
                                            : ops::add_rms_norm_fused(in[0], in[1], in[2], eps);
        return {sum, y};
      },
      // x, residual, weight in; sum, y, rstd out.
      [](int64_t r, int64_t c, double e) { return 4.0 * r * c * e + c * e + 4.0 * r; },
      // dy, dsum, sum, weight, rstd in; dx, dweight out.
      [](int64_t r, int64_t c, double e) { return 4.0 * r * c * e + 2.0 * c * e + 4.0 * r; },
      [](int64_t r, int64_t c) {
        return std::vector<std::vector<int64_t>>{{r, c}, {r, c}, {c}};
      }};
  k["swiglu"] = Kernel{{"gate", "up"},
                       {"out"},
                       {"reference", "fused"},
                       [](const std::string& impl, const Tensors& in, double) -> Tensors {
                         if (impl == "reference") return {ops::swiglu_reference(in[0], in[1])};
                         return {ops::swiglu_fused(in[0], in[1])};
                       },
                       // gate, up in; out out.
                       [](int64_t r, int64_t c, double e) { return 3.0 * r * c * e; },
                       // dout, gate, up in; dgate, dup out.
                       [](int64_t r, int64_t c, double e) { return 5.0 * r * c * e; },
                       [](int64_t r, int64_t c) {
                         return std::vector<std::vector<int64_t>>{{r, c}, {r, c}};
                       }};
  return k;
}

const Kernel& kernel_named(const std::string& name) {
  static const std::map<std::string, Kernel> all = kernels();
  const auto it = all.find(name);
  if (it == all.end())
    fail("dspine-bench kernels: unknown kernel '{}' (rms_norm | add_rms_norm | swiglu)", name);
  return it->second;
}

torch::Dtype parse_dtype(const std::string& name) {
  if (name == "bf16") return torch::kBFloat16;
  if (name == "fp16") return torch::kFloat16;
  if (name == "fp32") return torch::kFloat32;
  fail("dspine-bench kernels: --dtype must be bf16 | fp16 | fp32, got '{}'", name);
}

std::pair<int64_t, int64_t> parse_shape(const std::string& text) {
  const auto x = text.find('x');
  try {
    if (x != std::string::npos)
      return {std::stoll(text.substr(0, x)), std::stoll(text.substr(x + 1))};
  } catch (const std::exception&) {
  }
  fail("dspine-bench kernels: --shapes entries are ROWSxCOLS, got '{}'", text);
}

Tensors make_inputs(const Kernel& kernel, int64_t rows, int64_t cols, torch::Dtype dtype) {
  Tensors inputs;
  const auto options = torch::TensorOptions(torch::kCUDA).dtype(dtype);
  for (const auto& shape : kernel.input_shapes(rows, cols)) {
    auto t = shape.size() == 1 ? torch::rand(shape, options) + 0.5 : torch::randn(shape, options);
    inputs.push_back(t.detach().requires_grad_(true));
  }
  return inputs;
}

Tensors gradients(const Tensors& outputs, const Tensors& inputs, const Tensors& grad_outputs,
                  bool retain) {
  return torch::autograd::grad(outputs, inputs, grad_outputs, retain);
}

struct Row {
  std::string kernel, impl, pass;
  int64_t rows, cols;
  double ms, bytes;
};

void run_benchmarks(const Options& options) {
  const torch::Dtype dtype = parse_dtype(options.dtype);
  const double element = double(torch::elementSize(dtype));
  const double copy_gbs = measure_copy_bandwidth_gbs();
  std::printf("device copy bandwidth: %.1f GB/s (read + write, cudaMemcpy D2D, 2 GiB)\n", copy_gbs);
  std::printf("%-13s %13s %-9s %-8s %9s %10s %9s %8s\n", "kernel", "shape", "impl", "pass", "ms",
              "MB", "GB/s", "%copy");
  std::vector<Row> rows;
  for (const auto& name : options.kernels) {
    const Kernel& kernel = kernel_named(name);
    std::vector<std::pair<int64_t, int64_t>> shapes;
    for (const auto& s : options.shapes) shapes.push_back(parse_shape(s));
    if (shapes.empty()) shapes = kDefaultShapes.at(name);
    for (const auto& [r, c] : shapes) {
      torch::manual_seed(0);
      const Tensors inputs = make_inputs(kernel, r, c, dtype);
      for (const auto& impl : kernel.impls) {
        Tensors outputs = kernel.forward(impl, inputs, options.eps);
        Tensors grad_outputs;
        for (const auto& o : outputs) grad_outputs.push_back(torch::randn_like(o));
        const double fwd = cuda_median_ms([&] { kernel.forward(impl, inputs, options.eps); },
                                   options.warmup, options.iterations);
        const double bwd = cuda_median_ms([&] { gradients(outputs, inputs, grad_outputs, true); },
                                   options.warmup, options.iterations);
        const double both = cuda_median_ms(
            [&] {
              gradients(kernel.forward(impl, inputs, options.eps), inputs, grad_outputs, false);
            },
            options.warmup, options.iterations);
        const double fb = kernel.forward_bytes(r, c, element),
                     bb = kernel.backward_bytes(r, c, element);
        for (const Row& row :
             {Row{name, impl, "fwd", r, c, fwd, fb}, Row{name, impl, "bwd", r, c, bwd, bb},
              Row{name, impl, "fwd+bwd", r, c, both, fb + bb}}) {
          const double gbs = row.bytes / (row.ms * 1e-3) / 1e9;
          std::printf("%-13s %13s %-9s %-8s %9.4f %10.1f %9.1f %7.1f%%\n", row.kernel.c_str(),
                      (std::to_string(r) + "x" + std::to_string(c)).c_str(), row.impl.c_str(),
                      row.pass.c_str(), row.ms, row.bytes / 1e6, gbs, 100.0 * gbs / copy_gbs);
          rows.push_back(row);
        }
      }
    }
  }
  if (!options.csv.empty()) {
    std::ofstream csv(options.csv);
    if (!csv) fail("dspine-bench kernels: cannot write --csv file '{}'", options.csv);
    csv << "kernel,rows,cols,dtype,impl,pass,ms,bytes,gbs,pct_copy,copy_gbs\n";
    for (const Row& row : rows) {
      const double gbs = row.bytes / (row.ms * 1e-3) / 1e9;
      csv << row.kernel << ',' << row.rows << ',' << row.cols << ',' << options.dtype << ','
          << row.impl << ',' << row.pass << ',' << row.ms << ',' << row.bytes << ',' << gbs << ','
          << 100.0 * gbs / copy_gbs << ',' << copy_gbs << '\n';
    }
  }
}

// Runs one kernel on the tensors of --in (its inputs by name, plus d<output> gradients) and
// writes the outputs and the inputs' gradients (d<input>) to --out.
void run_file(const Options& options) {
  if (options.kernels.size() != 1)
    fail("dspine-bench kernels --in: name exactly one kernel with --kernels");
  const Kernel& kernel = kernel_named(options.kernels[0]);
  if (std::find(kernel.impls.begin(), kernel.impls.end(), options.impl) == kernel.impls.end()) {
    fail("dspine-bench kernels: kernel '{}' has no implementation '{}'", options.kernels[0],
         options.impl);
  }
  const auto file = core::load_safetensors(options.in);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  Tensors inputs;
  for (const auto& name : kernel.input_names)
    inputs.push_back(file.at(name).to(device).requires_grad_(true));
  const Tensors outputs = kernel.forward(options.impl, inputs, options.eps);
  Tensors grad_outputs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string name = "d" + kernel.output_names[i];
    grad_outputs.push_back(file.contains(name) ? file.at(name).to(device)
                                               : torch::zeros_like(outputs[i]));
  }
  const Tensors grads = gradients(outputs, inputs, grad_outputs, false);
  core::NamedTensors written;
  for (size_t i = 0; i < outputs.size(); ++i)
    written.emplace_back(kernel.output_names[i], outputs[i].detach());
  for (size_t i = 0; i < grads.size(); ++i)
    written.emplace_back("d" + kernel.input_names[i], grads[i]);
  core::save_safetensors(options.out, written,
                         {{"kernel", options.kernels[0]},
                          {"impl", options.impl},
                          {"eps", std::to_string(options.eps)}});
  std::printf("%s (%s): wrote %zu tensors to %s\n", options.kernels[0].c_str(),
              options.impl.c_str(), written.size(), options.out.c_str());
}

}  // namespace

void register_kernel_bench(CLI::App& app) {
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("kernels",
                                     "RMSNorm, add+RMSNorm and SwiGLU: ATen reference vs fused "
                                     "kernels (time, GB/s, % of copy bandwidth)");
  cmd->add_option("--kernels", options->kernels, "rms_norm | add_rms_norm | swiglu (default: all)");
  cmd->add_option("--shapes", options->shapes, "ROWSxCOLS list (default: each kernel's shapes)");
  cmd->add_option("--dtype", options->dtype, "bf16 | fp16 | fp32");
  cmd->add_option("--warmup", options->warmup, "untimed calls before timing");
  cmd->add_option("--iters", options->iterations, "timed calls (the median is reported)");
  cmd->add_option("--eps", options->eps, "RMSNorm epsilon");
  cmd->add_option("--csv", options->csv, "also write the table as CSV");
  cmd->add_option("--in", options->in,
                  "safetensors inputs: run one kernel on them instead of benchmarking");
  cmd->add_option("--out", options->out, "safetensors file for the outputs and gradients of --in");
  cmd->add_option("--impl", options->impl, "implementation for --in: fused | reference | aten");
  cmd->callback([options] {
    if (!options->in.empty() || !options->out.empty()) {
      if (options->in.empty() || options->out.empty())
        fail("dspine-bench kernels: --in and --out go together");
      run_file(*options);
      return;
    }
    if (!torch::cuda::is_available()) fail("dspine-bench kernels: benchmarks need a CUDA device");
    if (options->iterations < 1)
      fail("dspine-bench kernels: --iters must be >= 1, got {}", options->iterations);
    run_benchmarks(*options);
  });
}

}  // namespace dspine::bench
