// Minimal safetensors codec (https://huggingface.co/docs/safetensors): an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}},
// then the raw little-endian tensor bytes. Files written here load in HF tooling and back.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace dspine::core {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct SafetensorsFile {
  NamedTensors tensors;                         // in file order
  std::map<std::string, std::string> metadata;  // the "__metadata__" entry (string values)

  // The tensor called `name`; throws dspine::Error naming the file and the tensor if absent.
  const at::Tensor& at(const std::string& name) const;
  bool contains(const std::string& name) const;
  std::string path;  // where it was read from (for error messages)
};

// Writes `tensors` (any device; copied to CPU, contiguous) to `path` via `path`.tmp + rename, so
// an interrupted write never leaves a truncated file under the final name. Supported dtypes:
// F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL. Duplicate or empty names are errors.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads a whole file into CPU tensors. Any malformation (short file, header length past the
// end, invalid JSON, unknown dtype, offsets that overlap/leave gaps/exceed the data, shape/size
// mismatch) throws dspine::Error naming the file and what is wrong.
SafetensorsFile load_safetensors(const std::string& path);

// The same for a whole file already in memory (`size` bytes at `data`); `path` names it in errors.
SafetensorsFile parse_safetensors(const void* data, size_t size, const std::string& path);

}  // namespace dspine::core
