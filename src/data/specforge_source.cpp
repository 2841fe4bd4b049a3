#include "data/specforge_source.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include <fmt/ranges.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include "core/error.h"
#include "core/safetensors.h"
#include "target/hf_checkpoint.h"

namespace dspine::data {
namespace fs = std::filesystem;
namespace {

constexpr const char* kEmbedKey = "model.embed_tokens.weight";
constexpr const char* kHeadKey = "lm_head.weight";

// The sample number of data_<i>.ckpt, or -1 for other names (sorted after, by path).
int64_t sample_number(const fs::path& path) {
  static const std::regex pattern(R"(data_(\d{1,18})\.(ckpt|pt))");
  std::smatch match;
  const std::string name = path.filename().string();
  return std::regex_match(name, match, pattern) ? std::stoll(match[1]) : -1;
}

// Tensor `key` of a sample dict, without a leading batch dimension of 1, with `dims` dimensions.
at::Tensor entry(const c10::Dict<c10::IValue, c10::IValue>& dict, const char* key, int64_t dims,
                 const std::string& path) {
  const auto it = dict.find(c10::IValue(std::string(key)));
  if (it == dict.end()) fail("{}: SpecForge sample has no '{}'", path, key);
  if (!it->value().isTensor()) fail("{}: '{}' is not a tensor", path, key);
  at::Tensor t = it->value().toTensor();
  if (t.dim() == dims + 1 && t.size(0) == 1) t = t.squeeze(0);
  if (t.dim() != dims) {
    fail("{}: '{}' has shape {}, expected {} dimensions (optionally after a batch dimension of 1)",
         path, key, c10::str(t.sizes()), dims);
  }
  return t;
}

// The sequence cut to seq_len or padded with zeros along dimension 0.
at::Tensor fit(const at::Tensor& t, int64_t seq_len) {
  if (t.size(0) >= seq_len) return t.narrow(0, 0, seq_len).contiguous();
  std::vector<int64_t> shape = t.sizes().vec();
  shape[0] = seq_len - t.size(0);
  return at::cat({t, at::zeros(shape, t.options())});
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.is_open() || in.bad()) fail("{}: cannot read the file", path);
  return bytes;
}

at::Tensor head_weight(const core::SafetensorsFile& file, const char* key,
                       const ShardLayout& layout) {
  const at::Tensor& t = file.at(key);
  if (t.sizes() != at::IntArrayRef({layout.vocab_size, layout.hidden_size})) {
    fail("{}: '{}' has shape {}, but the config has [model.vocab_size = {}, model.hidden_size = "
         "{}]", file.path, key, c10::str(t.sizes()), layout.vocab_size, layout.hidden_size);
  }
  return t.to(at::kFloat).contiguous();
}

// A sample file's tensors, checked against `layout`, without a leading batch dimension of 1.
struct SampleTensors {
  at::Tensor input_ids, loss_mask;  // int64
  at::Tensor aux_hidden_state, hidden_state;  // as stored
};

SampleTensors load_sample(const std::string& path, const ShardLayout& layout) {
  c10::IValue value;
  try {
    value = torch::pickle_load(read_bytes(path));
  } catch (const c10::Error& e) {
    fail("{}: not a torch.save file: {}", path, e.what_without_backtrace());
  }
  if (!value.isGenericDict()) fail("{}: expected a dict of tensors (SpecForge sample)", path);
  const auto dict = value.toGenericDict();
  const at::Tensor ids = entry(dict, "input_ids", 1, path);
  const at::Tensor mask = entry(dict, "loss_mask", 1, path);
  const at::Tensor last = entry(dict, "hidden_state", 2, path);
  const at::Tensor aux = entry(dict, "aux_hidden_state", 2, path);
  const int64_t seq = ids.size(0), hidden = layout.hidden_size;
  const int64_t width = hidden * static_cast<int64_t>(layout.target_layer_ids.size());
  const auto expect_shape = [&](const char* key, const at::Tensor& t, at::IntArrayRef shape) {
    if (t.sizes() != shape) {
      fail("{}: '{}' has shape {}, expected {} (input_ids length {}; model.hidden_size {}, {} "
           "target layers)", path, key, c10::str(t.sizes()), c10::str(shape), seq, hidden,
           layout.target_layer_ids.size());
    }
  };
  expect_shape("loss_mask", mask, {seq});
  expect_shape("hidden_state", last, {seq, hidden});
  expect_shape("aux_hidden_state", aux, {seq, width});
  if (seq < 1) fail("{}: 'input_ids' is empty", path);
  if (at::isFloatingType(ids.scalar_type()) || at::isFloatingType(mask.scalar_type())) {
    fail("{}: 'input_ids' and 'loss_mask' must be integer or bool tensors", path);
  }
  if (!at::isFloatingType(last.scalar_type()) || !at::isFloatingType(aux.scalar_type())) {
    fail("{}: 'hidden_state' and 'aux_hidden_state' must be floating point", path);
  }
  const at::Tensor ids_long = ids.to(at::kLong);
  if (ids_long.min().item<int64_t>() < 0 || ids_long.max().item<int64_t>() >= layout.vocab_size) {
    fail("{}: 'input_ids' outside the vocabulary [0, model.vocab_size = {})", path,
         layout.vocab_size);
  }
  const at::Tensor mask_long = mask.to(at::kLong);
  if (mask_long.min().item<int64_t>() < 0 || mask_long.max().item<int64_t>() > 1) {
    fail("{}: 'loss_mask' must hold 0 and 1 only", path);
  }
  return {ids_long, mask_long, aux, last};
}

}  // namespace

std::vector<std::string> list_specforge_samples(const std::string& dir) {
  if (!fs::is_directory(dir)) fail("{}: no such SpecForge sample directory", dir);
  std::vector<fs::path> files;
  for (const auto& item : fs::recursive_directory_iterator(dir)) {
    const std::string ext = item.path().extension().string();
    if (item.is_regular_file() && (ext == ".ckpt" || ext == ".pt")) files.push_back(item.path());
  }
  if (files.empty()) fail("{}: holds no SpecForge samples (*.ckpt or *.pt files)", dir);
  std::sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) {
    const int64_t na = sample_number(a), nb = sample_number(b);
    if ((na < 0) != (nb < 0)) return nb < 0;  // numbered samples first
    return na != nb ? na < nb : a < b;
  });
  return {files.begin(), files.end()};
}

DraftBatch read_specforge_sample(const std::string& path, const ShardLayout& layout) {
  const SampleTensors t = load_sample(path, layout);
  const int64_t s = layout.seq_len;
  return DraftBatch{fit(t.input_ids, s).unsqueeze(0), fit(t.loss_mask, s).unsqueeze(0),
                    fit(t.aux_hidden_state.to(at::kFloat), s).unsqueeze(0),
                    fit(t.hidden_state.to(at::kFloat), s).unsqueeze(0)};
}

void check_specforge_samples(const std::vector<std::string>& files, const ShardLayout& layout) {
  for (const std::string& file : files) load_sample(file, layout);
}

std::pair<at::Tensor, at::Tensor> read_hf_head_weights(const std::string& dir,
                                                       const ShardLayout& layout) {
  const std::string embed_file = target::hf_file_holding(dir, kEmbedKey);
  if (embed_file.empty()) fail("{}: its weight index names no '{}'", dir, kEmbedKey);
  const core::SafetensorsFile embed_source = core::load_safetensors(embed_file);
  const at::Tensor embed = head_weight(embed_source, kEmbedKey, layout);
  // No lm_head.weight: tied to the embedding.
  const std::string head_file = target::hf_file_holding(dir, kHeadKey);
  if (head_file == embed_file) {
    return {embed, embed_source.contains(kHeadKey) ? head_weight(embed_source, kHeadKey, layout)
                                                   : embed};
  }
  if (head_file.empty()) return {embed, embed};
  return {embed, head_weight(core::load_safetensors(head_file), kHeadKey, layout)};
}

SpecforgeSource::SpecforgeSource(const core::DataConfig& data, const core::ModelConfig& draft)
    : dir_(data.specforge_dir),
      layout_(shard_layout(data, draft)),
      files_(list_specforge_samples(dir_)) {
  std::tie(embed_tokens_, lm_head_) = read_hf_head_weights(data.target.path, layout_);
  check_specforge_samples(files_, layout_);
}

SpecforgeSource::SpecforgeSource(const SpecforgeSource& training, const std::string& dir)
    : dir_(dir),
      layout_(training.layout_),
      files_(list_specforge_samples(dir_)),
      embed_tokens_(training.embed_tokens_),
      lm_head_(training.lm_head_) {
  check_specforge_samples(files_, layout_);
}

DraftBatch SpecforgeSource::next(int64_t rows) {
  if (rows < 1) fail("specforge source: rows must be >= 1 (got {})", rows);
  std::vector<DraftBatch> samples;
  for (int64_t r = 0; r < rows; ++r) {
    const auto index = static_cast<size_t>((cursor_ + r) % static_cast<int64_t>(files_.size()));
    samples.push_back(read_specforge_sample(files_[index], layout_));
  }
  cursor_ += rows;
  return concat_rows(samples);
}

void SpecforgeSource::seek(int64_t cursor) {
  if (cursor < 0) fail("specforge source: cursor must be >= 0 (got {})", cursor);
  cursor_ = cursor;
}

}  // namespace dspine::data
