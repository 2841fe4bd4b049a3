#include "objectives/row_streams.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <vector>

#include "core/error.h"
#include "core/seeding.h"

namespace dspine::objectives {

at::Generator RowStreams::generator(int64_t row, RowDraw kind) const {
  const uint64_t at_step = core::stream_seed(static_cast<int64_t>(seed), step);
  const uint64_t at_row = core::stream_seed(static_cast<int64_t>(at_step), first_row + row);
  const uint64_t key = core::stream_seed(static_cast<int64_t>(at_row), static_cast<int64_t>(kind));
  return at::make_generator<at::CPUGeneratorImpl>(core::generator_seed(key));
}

at::Tensor RowStreams::uniform(RowDraw kind, int64_t rows, int64_t count,
                               c10::ScalarType dtype) const {
  auto out = torch::empty({rows, count}, torch::TensorOptions().dtype(dtype));
  for (int64_t r = 0; r < rows; ++r) out[r].uniform_(0.0, 1.0, generator(r, kind));
  return out;
}

at::Tensor RowStreams::uniform(RowDraw kind, const at::Tensor& counts,
                               c10::ScalarType dtype) const {
  const auto host = counts.to(torch::kCPU, torch::kInt64).contiguous();
  const auto* n = host.data_ptr<int64_t>();
  std::vector<at::Tensor> parts;
  for (int64_t r = 0; r < host.numel(); ++r) {
    if (n[r] < 0) fail("row {} asks for {} random draws", first_row + r, n[r]);
    auto part = torch::empty({n[r]}, torch::TensorOptions().dtype(dtype));
    if (n[r] > 0) part.uniform_(0.0, 1.0, generator(r, kind));
    parts.push_back(part);
  }
  return parts.empty() ? torch::empty({0}, torch::TensorOptions().dtype(dtype)) : torch::cat(parts);
}

}  // namespace dspine::objectives
