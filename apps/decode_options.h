// What dspine-decode and `dspine-data regenerate` share of their command lines: the device and
// dtype a target runs on (--device, --dtype), and how many token samples to read from --offset.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include <torch/torch.h>

#include "core/error.h"
#include "data/token_samples.h"

namespace dspine::cli {

struct DecodeDevice {
  torch::Device device;
  torch::Dtype dtype;
};

// device: auto (CUDA when there is one), cpu or cuda; dtype: auto (bf16 on CUDA, fp32 on the
// CPU), fp32 or bf16.
inline DecodeDevice decode_device(const std::string& device, const std::string& dtype) {
  if (device == "cuda" && !torch::cuda::is_available()) fail("--device cuda: no CUDA device");
  const bool cuda = device == "cuda" || (device == "auto" && torch::cuda::is_available());
  const bool bf16 = dtype == "bf16" || (dtype == "auto" && cuda);
  return {torch::Device(cuda ? torch::kCUDA : torch::kCPU),
          bf16 ? torch::kBFloat16 : torch::kFloat32};
}

// The samples to read from `offset` of `samples`: `wanted` (every one left when 0) at most.
inline int64_t samples_from(const data::TokenSamples& samples, int64_t offset, int64_t wanted) {
  if (offset >= samples.size()) {
    fail("--offset {}: {} holds {} samples", offset, samples.path(), samples.size());
  }
  const int64_t left = samples.size() - offset;
  return wanted > 0 ? std::min(wanted, left) : left;
}

}  // namespace dspine::cli
