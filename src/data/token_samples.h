// Token samples: a JSONL file with one {"input_ids": [...], "loss_mask": [...]} object per line
// (the output of scripts/prepare_data.py; docs/data.md). Read by sample index: the file is read
// once at construction, in large blocks, to index the byte offset of every non-blank line and to
// check every line (on at::get_num_threads() threads), so a bad line stops the run before
// training; a sample is parsed again, with the same rules, when asked for.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace dspine::data {

struct TokenSample {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> loss_mask;  // 0/1, 1 = supervised (assistant) token
};

class TokenSamples {
 public:
  // Indexes and checks `path` with the rules of read() (errors name it: unreadable, with the
  // key it came from (`key`, e.g. data.samples; "" for a path given directly) and the OS reason,
  // no samples, or file:line and what is wrong). `vocab_size` bounds the token ids.
  TokenSamples(std::string path, int64_t vocab_size, const std::string& key = "");

  int64_t size() const { return static_cast<int64_t>(offsets_.size()); }
  const std::string& path() const { return path_; }
  // Sample `index` in [0, size()); errors name the file, the line and what is wrong.
  TokenSample read(int64_t index);
  // Samples first, first+1, ... (wrapping around: epochs) as [rows, seq_len] int64 input_ids and
  // loss_mask: longer samples are cut to their first seq_len tokens, shorter ones padded with
  // token 0 and loss 0.
  std::pair<at::Tensor, at::Tensor> rows(int64_t first, int64_t rows, int64_t seq_len);

 private:
  std::string path_;
  int64_t vocab_size_;
  std::ifstream file_;
  std::vector<int64_t> offsets_;  // byte offset of each sample's line
  std::vector<int64_t> lines_;    // its 1-based line number, for errors
};

}  // namespace dspine::data
