#include "model/module_state.h"

#include <filesystem>

#include <torch/torch.h>

#include "core/error.h"

namespace dspine::model {

core::NamedTensors module_state(torch::nn::Module& module) {
  core::NamedTensors tensors;
  for (const auto& item : module.named_parameters()) tensors.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers()) tensors.emplace_back(item.key(), item.value());
  return tensors;
}

void load_module_state(torch::nn::Module& module, const core::SafetensorsFile& file) {
  torch::NoGradGuard no_grad;
  size_t expected = 0;
  auto restore = [&](const std::string& name, torch::Tensor& target) {
    ++expected;
    const auto& saved = file.at(name);
    if (!saved.sizes().equals(target.sizes())) {
      fail("{}: tensor {} has shape {}, the model expects {}", file.path, name,
           c10::str(saved.sizes()), c10::str(target.sizes()));
    }
    target.copy_(saved);
  };
  for (auto& item : module.named_parameters()) restore(item.key(), item.value());
  for (auto& item : module.named_buffers()) restore(item.key(), item.value());
  if (file.tensors.size() != expected) {
    fail("{}: holds {} tensors, the model has {} (not the checkpoint of this model?)", file.path,
         file.tensors.size(), expected);
  }
}

std::string weights_file(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) fail("{}: no such checkpoint directory or weights file", path);
  if (!fs::is_directory(path)) return path;
  const auto file = fs::path(path) / "model.safetensors";
  if (!fs::exists(file)) fail("checkpoint directory {} has no model.safetensors", path);
  return file.string();
}

}  // namespace dspine::model
