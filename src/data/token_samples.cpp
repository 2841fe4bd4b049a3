#include "data/token_samples.h"

#include <algorithm>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "core/error.h"
#include "data/json_integer.h"

namespace dspine::data {
namespace {

// The integer list `key` of one sample line; errors name file:line.
std::vector<int64_t> id_list(const nlohmann::json& json, const char* key, const std::string& where) {
  if (!json.contains(key)) fail("{}: missing key '{}'", where, key);
  const nlohmann::json& list = json.at(key);
  if (!list.is_array() || !std::all_of(list.begin(), list.end(), is_int64)) {
    fail("{}: '{}' must be a list of integers", where, key);
  }
  return list.get<std::vector<int64_t>>();
}

}  // namespace

TokenSamples::TokenSamples(std::string path, int64_t vocab_size)
    : path_(std::move(path)), vocab_size_(vocab_size), file_(path_, std::ios::binary) {
  if (!file_.is_open()) fail("{}: cannot open the token samples file", path_);
  std::string line;
  int64_t offset = 0;
  for (int64_t number = 1; std::getline(file_, line); ++number) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) {
      offsets_.push_back(offset);
      lines_.push_back(number);
    }
    offset += static_cast<int64_t>(line.size()) + 1;
  }
  if (file_.bad()) fail("{}: read error while indexing the token samples", path_);
  if (offsets_.empty()) fail("{}: holds no samples (expected one JSON object per line)", path_);
}

TokenSample TokenSamples::read(int64_t index) {
  if (index < 0 || index >= size()) {
    fail("{}: sample {} out of range [0, {})", path_, index, size());
  }
  const std::string where = fmt::format("{}:{}", path_, lines_[index]);
  file_.clear();
  file_.seekg(offsets_[index]);
  std::string line;
  std::getline(file_, line);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", where, e.what());
  }
  if (!json.is_object()) fail("{}: expected a JSON object with input_ids and loss_mask", where);
  TokenSample sample{id_list(json, "input_ids", where), id_list(json, "loss_mask", where)};
  if (sample.input_ids.empty()) fail("{}: input_ids is empty", where);
  if (sample.input_ids.size() != sample.loss_mask.size()) {
    fail("{}: input_ids has {} tokens but loss_mask {}", where, sample.input_ids.size(),
         sample.loss_mask.size());
  }
  for (size_t i = 0; i < sample.input_ids.size(); ++i) {
    if (sample.input_ids[i] < 0 || sample.input_ids[i] >= vocab_size_) {
      fail("{}: input_ids[{}] = {} is outside the vocabulary [0, {})", where, i,
           sample.input_ids[i], vocab_size_);
    }
    if (sample.loss_mask[i] != 0 && sample.loss_mask[i] != 1) {
      fail("{}: loss_mask[{}] = {} must be 0 or 1", where, i, sample.loss_mask[i]);
    }
  }
  return sample;
}

std::pair<at::Tensor, at::Tensor> TokenSamples::rows(int64_t first, int64_t rows, int64_t seq_len) {
  if (first < 0 || rows < 1 || seq_len < 1) {
    fail("{}: cannot read {} rows of {} tokens from sample {}", path_, rows, seq_len, first);
  }
  at::Tensor ids = torch::zeros({rows, seq_len}, torch::kLong);
  at::Tensor mask = torch::zeros({rows, seq_len}, torch::kLong);
  auto ids_a = ids.accessor<int64_t, 2>();
  auto mask_a = mask.accessor<int64_t, 2>();
  for (int64_t r = 0; r < rows; ++r) {
    const TokenSample sample = read((first + r) % size());
    const int64_t n = std::min<int64_t>(seq_len, static_cast<int64_t>(sample.input_ids.size()));
    for (int64_t t = 0; t < n; ++t) {
      ids_a[r][t] = sample.input_ids[t];
      mask_a[r][t] = sample.loss_mask[t];
    }
  }
  return {ids, mask};
}

}  // namespace dspine::data
