#include "objectives/chunking.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include "core/error.h"

namespace dspine::objectives {

const char* const kChunkCheckpointNodeName = "ChunkCheckpoint";

namespace {

struct ChunkFnHolder : torch::CustomClassHolder {
  explicit ChunkFnHolder(ChunkFn f) : fn(std::move(f)) {}
  ChunkFn fn;
};

// Inputs = chunk tensors followed by the parameters fn closes over; outputs = fn's scalars.
struct ChunkCheckpoint : torch::autograd::Function<ChunkCheckpoint> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const ChunkFn& fn, int64_t num_chunk_inputs,
                                                at::TensorList inputs) {
    // Function::apply runs this without grad: fn's intermediates are freed at once.
    ctx->saved_data["fn"] = c10::IValue::make_capsule(c10::make_intrusive<ChunkFnHolder>(fn));
    ctx->saved_data["num_chunk_inputs"] = num_chunk_inputs;
    ctx->save_for_backward(inputs.vec());
    std::vector<at::Tensor> chunk(inputs.begin(), inputs.begin() + num_chunk_inputs);
    auto outputs = fn(chunk);
    for (auto& o : outputs) {
      if (!o.is_floating_point()) o = o.to(torch::kFloat32);
    }
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto holder = ctx->saved_data["fn"].toCapsule();
    const auto& fn = static_cast<ChunkFnHolder*>(holder.get())->fn;
    const int64_t num_chunk = ctx->saved_data["num_chunk_inputs"].toInt();
    auto saved = ctx->get_saved_variables();

    std::vector<at::Tensor> chunk;
    std::vector<at::Tensor> wrt;
    std::vector<size_t> wrt_index;
    for (int64_t i = 0; i < num_chunk; ++i) {
      auto input = saved[i].detach();
      if (saved[i].requires_grad()) {
        input.requires_grad_(true);
        wrt.push_back(input);
        wrt_index.push_back(i);
      }
      chunk.push_back(input);
    }
    for (size_t i = num_chunk; i < saved.size(); ++i) {
      if (saved[i].requires_grad()) {
        wrt.push_back(saved[i]);
        wrt_index.push_back(i);
      }
    }

    torch::autograd::variable_list outputs, grads_in;
    {
      torch::AutoGradMode enable(true);
      auto recomputed = fn(chunk);
      for (size_t i = 0; i < recomputed.size(); ++i) {
        if (recomputed[i].requires_grad() && grad_outputs[i].defined()) {
          outputs.push_back(recomputed[i]);
          grads_in.push_back(grad_outputs[i]);
        }
      }
    }
    torch::autograd::variable_list result(saved.size() + 2);  // + fn, num_chunk_inputs
    if (outputs.empty() || wrt.empty()) return result;
    auto grads = torch::autograd::grad(outputs, wrt, grads_in, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < wrt.size(); ++k) result[wrt_index[k] + 2] = grads[k];
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> checkpointed_chunk_reduce(const ChunkFn& fn,
                                                  const std::vector<at::Tensor>& tensors,
                                                  int64_t chunk_size,
                                                  const std::vector<at::Tensor>& parameters) {
  if (tensors.empty()) fail("checkpointed_chunk_reduce needs at least one tensor");
  if (chunk_size < 0) fail("objective_chunk_blocks must be >= 0 (got {})", chunk_size);
  const int64_t rows = tensors[0].dim() == 0 ? -1 : tensors[0].size(0);
  for (const auto& t : tensors) {
    if (t.dim() == 0 || t.size(0) != rows) {
      fail("checkpointed_chunk_reduce: tensors must share a non-empty leading dimension ({} vs {})",
           c10::str(tensors[0].sizes()), c10::str(t.sizes()));
    }
  }
  if (rows == 0) fail("checkpointed_chunk_reduce: empty leading dimension");
  if (chunk_size == 0) return fn(tensors);

  bool needs_grad = false;
  if (torch::GradMode::is_enabled()) {
    for (const auto& t : tensors) needs_grad = needs_grad || t.requires_grad();
  }
  std::vector<at::Tensor> sums;
  for (int64_t begin = 0; begin < rows; begin += chunk_size) {
    std::vector<at::Tensor> chunk;
    for (const auto& t : tensors) chunk.push_back(t.slice(0, begin, begin + chunk_size));
    std::vector<at::Tensor> out;
    if (needs_grad) {
      torch::autograd::variable_list inputs = chunk;
      inputs.insert(inputs.end(), parameters.begin(), parameters.end());
      // A TensorList (not a std::vector) is what autograd tracks as differentiable inputs.
      out = ChunkCheckpoint::apply(fn, static_cast<int64_t>(chunk.size()), at::TensorList(inputs));
    } else {
      out = fn(chunk);
    }
    if (sums.empty()) {
      sums = out;
    } else {
      if (out.size() != sums.size()) {
        fail("checkpointed_chunk_reduce: fn returned {} values, earlier chunks {}", out.size(),
             sums.size());
      }
      for (size_t i = 0; i < out.size(); ++i) sums[i] = sums[i] + out[i];
    }
  }
  return sums;
}

}  // namespace dspine::objectives
