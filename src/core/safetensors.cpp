// The safetensors layout (safetensors.h): u64 little-endian header length N, N bytes of JSON
// (padded with spaces to a multiple of 8, as the reference writer does), then the tensor bytes.
#include "core/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"

// Tensor bytes are copied to and from memory as they are; the format is little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors I/O assumes a little-endian host");

namespace dspine::core {
namespace {

using Json = nlohmann::ordered_json;  // keeps the header in the order it was written

// The reference implementation refuses headers above 100 MB; so do we, before allocating.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
const char* const kMetadataKey = "__metadata__";

struct DtypeName {
  at::ScalarType type;
  const char* name;
};
const DtypeName kDtypes[] = {
    {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"},
    {at::kLong, "I64"},   {at::kInt, "I32"},   {at::kShort, "I16"}, {at::kChar, "I8"},
    {at::kByte, "U8"},    {at::kBool, "BOOL"},
};

const char* dtype_name(at::ScalarType type, const std::string& path, const std::string& tensor) {
  for (const DtypeName& d : kDtypes) {
    if (d.type == type) return d.name;
  }
  fail("{}: cannot save tensor '{}' of dtype {}; supported: F64 F32 F16 BF16 I64 I32 I16 I8 U8 "
       "BOOL",
       path, tensor, c10::toString(type));
}

std::string join_shape(const std::vector<int64_t>& shape) {
  std::string out;
  for (int64_t size : shape) out += (out.empty() ? "" : ", ") + std::to_string(size);
  return "[" + out + "]";
}

// Closes the file on every path out of a function.
struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

void write_all(std::FILE* file, const void* data, size_t bytes, const std::string& temp_path) {
  if (bytes > 0 && std::fwrite(data, 1, bytes, file) != bytes) {
    fail("cannot write '{}': {}", temp_path, std::strerror(errno));
  }
}

void write_file(const std::string& temp_path, const std::string& header,
                const std::vector<at::Tensor>& contiguous) {
  File file(std::fopen(temp_path.c_str(), "wb"));
  if (!file) fail("cannot create '{}': {}", temp_path, std::strerror(errno));
  const uint64_t header_length = header.size();
  write_all(file.get(), &header_length, sizeof(header_length), temp_path);
  write_all(file.get(), header.data(), header.size(), temp_path);
  for (const at::Tensor& tensor : contiguous) {
    write_all(file.get(), tensor.data_ptr(), tensor.nbytes(), temp_path);
  }
  // write_file_atomically syncs the file before its rename.
  if (std::fflush(file.get()) != 0) fail("cannot write '{}': {}", temp_path, std::strerror(errno));
  std::FILE* raw = file.release();
  if (std::fclose(raw) != 0) fail("cannot write '{}': {}", temp_path, std::strerror(errno));
}

// The parsed description of one tensor in a file.
struct Entry {
  std::string name;
  at::ScalarType type;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

// Reads a safetensors file front to back from a source of `size` bytes; `read(out, bytes)` copies
// the next bytes, so a file streams into the tensors without a second copy in memory.
class Loader {
 public:
  using Read = std::function<void(void* out, size_t bytes)>;
  Loader(const std::string& path, uint64_t size, Read read)
      : path_(path), size_(size), read_(std::move(read)) {}

  SafetensorsFile load() {
    if (size_ < 8) {
      fail("{}: truncated safetensors file: {} bytes, shorter than the 8-byte header length",
           path_, size_);
    }
    uint64_t header_length = 0;
    read_(&header_length, 8);
    if (header_length > size_ - 8) {
      fail("{}: header length {} is larger than the {} bytes that follow it (truncated or not a "
           "safetensors file)",
           path_, header_length, size_ - 8);
    }
    if (header_length > kMaxHeaderBytes) {
      fail("{}: header length {} exceeds the {} byte limit", path_, header_length,
           kMaxHeaderBytes);
    }
    std::string header(header_length, '\0');
    read_(header.data(), header.size());

    SafetensorsFile result;
    result.path = path_;
    std::vector<Entry> entries = parse_header(header, result.metadata);
    check_layout(entries, size_ - 8 - header_length);
    for (const Entry& entry : entries) {
      at::Tensor tensor = at::empty(entry.shape, at::TensorOptions().dtype(entry.type));
      read_(tensor.data_ptr(), entry.end - entry.begin);
      if (entry.type == at::kBool) check_bools(entry, tensor);
      result.tensors.emplace_back(entry.name, std::move(tensor));
    }
    return result;
  }

 private:
  uint64_t read_size(const Json& value, const std::string& what, const std::string& name) const {
    if (!value.is_number_unsigned()) {
      fail("{}: tensor '{}': {} must hold non-negative integers, got {}", path_, name, what,
           value.dump());
    }
    return value.get<uint64_t>();
  }

  std::vector<Entry> parse_header(const std::string& text,
                                  std::map<std::string, std::string>& metadata) const {
    Json header;
    try {
      header = Json::parse(text);
    } catch (const Json::exception& e) {  // parse_error, or out_of_range for a huge number
      fail("{}: invalid JSON header: {}", path_, e.what());
    }
    if (!header.is_object()) fail("{}: the JSON header must be an object", path_);
    std::vector<Entry> entries;
    for (const auto& [name, value] : header.items()) {
      if (name == kMetadataKey) {
        if (!value.is_object()) fail("{}: {} must be an object of strings", path_, kMetadataKey);
        for (const auto& [key, item] : value.items()) {
          if (!item.is_string()) {
            fail("{}: {} entry '{}' must be a string, got {}", path_, kMetadataKey, key,
                 item.dump());
          }
          metadata[key] = item.get<std::string>();
        }
        continue;
      }
      entries.push_back(parse_entry(name, value));
    }
    // File order is data order; a stable sort keeps header order among zero-byte tensors.
    std::stable_sort(entries.begin(), entries.end(),
                     [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
    return entries;
  }

  Entry parse_entry(const std::string& name, const Json& value) const {
    check_fields(name, value);
    Entry entry;
    entry.name = name;
    const std::string dtype_text = parse_dtype(name, value["dtype"], entry);
    const Extent extent = parse_shape(name, value["shape"], entry);
    const Json& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2) {
      fail("{}: tensor '{}': data_offsets must be [begin, end], got {}", path_, name,
           offsets.dump());
    }
    entry.begin = read_size(offsets[0], "data_offsets", name);
    entry.end = read_size(offsets[1], "data_offsets", name);
    if (entry.begin > entry.end) {
      fail("{}: tensor '{}': data_offsets [{}, {}] end before they begin", path_, name,
           entry.begin, entry.end);
    }
    const uint64_t element_size = c10::elementSize(entry.type);
    if (extent.overflow || extent.numel > std::numeric_limits<uint64_t>::max() / element_size ||
        extent.numel * element_size != entry.end - entry.begin) {
      fail("{}: tensor '{}': shape {} of dtype {} does not match data_offsets [{}, {}] ({} bytes)",
           path_, name, join_shape(entry.shape), dtype_text, entry.begin, entry.end,
           entry.end - entry.begin);
    }
    return entry;
  }

  // An entry is an object of exactly dtype, shape and data_offsets.
  void check_fields(const std::string& name, const Json& value) const {
    if (name.empty()) fail("{}: a tensor has an empty name", path_);
    if (!value.is_object()) fail("{}: tensor '{}': entry must be an object", path_, name);
    for (const auto& [field, item] : value.items()) {
      if (field != "dtype" && field != "shape" && field != "data_offsets") {
        fail("{}: tensor '{}': unexpected field '{}'", path_, name, field);
      }
    }
    if (!value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets")) {
      fail("{}: tensor '{}': entry needs dtype, shape and data_offsets", path_, name);
    }
  }

  // Sets entry.type from the dtype field; returns the field as written, for messages.
  std::string parse_dtype(const std::string& name, const Json& dtype, Entry& entry) const {
    const std::string dtype_text = dtype.is_string() ? dtype.get<std::string>() : dtype.dump();
    const DtypeName* found = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                                          [&](const DtypeName& d) { return dtype_text == d.name; });
    if (found == std::end(kDtypes)) {
      fail("{}: tensor '{}': unknown dtype '{}'; supported: F64 F32 F16 BF16 I64 I32 I16 I8 U8 "
           "BOOL",
           path_, name, dtype_text);
    }
    entry.type = found->type;
    return dtype_text;
  }

  // The element count of a shape, and whether the product of its nonzero sizes overflows.
  struct Extent {
    uint64_t numel = 0;
    bool overflow = false;
  };

  // Sets entry.shape from the shape field.
  Extent parse_shape(const std::string& name, const Json& shape, Entry& entry) const {
    if (!shape.is_array()) fail("{}: tensor '{}': shape must be a list", path_, name);
    // The product of the nonzero sizes must fit int64_t even when another size is 0: torch
    // computes strides from it, and an empty [0, 2^62, 2^62] would throw c10::Error.
    constexpr uint64_t kMaxExtent = std::numeric_limits<int64_t>::max();
    uint64_t extent = 1;
    bool empty = false, overflow = false;
    for (const Json& size : shape) {
      const uint64_t dim = read_size(size, "shape", name);
      entry.shape.push_back(static_cast<int64_t>(dim));
      empty = empty || dim == 0;
      overflow = overflow || dim > kMaxExtent || (dim != 0 && extent > kMaxExtent / dim);
      if (!overflow && dim != 0) extent *= dim;
    }
    return {empty ? 0 : extent, overflow};
  }

  // The tensors must tile the data section exactly: no overlap, no gap, nothing past the end.
  void check_layout(const std::vector<Entry>& entries, uint64_t data_size) const {
    uint64_t position = 0;
    for (const Entry& entry : entries) {
      if (entry.end > data_size) {
        fail("{}: tensor '{}': data_offsets [{}, {}] are out of range: the data section holds {} "
             "bytes",
             path_, entry.name, entry.begin, entry.end, data_size);
      }
      if (entry.begin != position) {
        fail("{}: tensor '{}': data_offsets [{}, {}] {} the previous tensor, which ends at {}",
             path_, entry.name, entry.begin, entry.end,
             entry.begin < position ? "overlap" : "leave a gap after", position);
      }
      position = entry.end;
    }
    if (position != data_size) {
      fail("{}: the tensors cover {} bytes but the data section holds {}", path_, position,
           data_size);
    }
  }

  void check_bools(const Entry& entry, const at::Tensor& tensor) const {
    const uint8_t* bytes = static_cast<const uint8_t*>(tensor.data_ptr());
    for (int64_t i = 0; i < tensor.numel(); ++i) {
      if (bytes[i] > 1) {
        fail("{}: tensor '{}': BOOL byte {} holds {}, not 0 or 1", path_, entry.name, i, bytes[i]);
      }
    }
  }

  std::string path_;
  uint64_t size_;
  Read read_;
};

}  // namespace

const at::Tensor& SafetensorsFile::at(const std::string& name) const {
  for (const auto& [tensor_name, tensor] : tensors) {
    if (tensor_name == name) return tensor;
  }
  fail("{}: no tensor named '{}' ({} tensors in the file)", path, name, tensors.size());
}

bool SafetensorsFile::contains(const std::string& name) const {
  return std::any_of(tensors.begin(), tensors.end(),
                     [&](const auto& entry) { return entry.first == name; });
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json& entries = header[kMetadataKey] = Json::object();
    for (const auto& [key, value] : metadata) entries[key] = value;
  }
  std::vector<at::Tensor> contiguous;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty()) fail("{}: cannot save a tensor with an empty name", path);
    if (name == kMetadataKey) {
      fail("{}: '{}' is reserved for metadata, not a tensor name", path, name);
    }
    if (header.contains(name)) fail("{}: tensor name '{}' is given twice", path, name);
    if (!tensor.defined()) fail("{}: tensor '{}' is undefined", path, name);
    const char* dtype = dtype_name(tensor.scalar_type(), path, name);
    contiguous.push_back(tensor.detach().to(at::kCPU).contiguous());
    const uint64_t bytes = contiguous.back().nbytes();
    header[name] = {{"dtype", dtype},
                    {"shape", tensor.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  try {
    write_file_atomically(path,
                          [&](const std::string& temp) { write_file(temp, text, contiguous); });
  } catch (const std::exception& e) {
    fail("cannot save safetensors file '{}': {}", path, e.what());
  }
}

SafetensorsFile load_safetensors(const std::string& path) {
  File file(std::fopen(path.c_str(), "rb"));
  if (!file) fail("cannot open safetensors file '{}': {}", path, std::strerror(errno));
  std::error_code error;
  const uint64_t size = std::filesystem::file_size(path, error);
  if (error) fail("cannot read safetensors file '{}': {}", path, error.message());
  return Loader(path, size, [&](void* out, size_t bytes) {
           if (bytes > 0 && std::fread(out, 1, bytes, file.get()) != bytes) {
             fail("{}: truncated safetensors file: read failed ({})", path,
                  std::ferror(file.get()) ? std::strerror(errno) : "unexpected end of file");
           }
         }).load();
}

SafetensorsFile parse_safetensors(const void* data, size_t size, const std::string& path) {
  const char* next = static_cast<const char*>(data);
  // The loader never reads past `size`: every length is checked against it first.
  return Loader(path, size, [&](void* out, size_t bytes) {
           if (bytes > 0) std::memcpy(out, next, bytes);
           next += bytes;
         }).load();
}

}  // namespace dspine::core
