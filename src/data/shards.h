// Safetensors shards of synthetic-target samples (what `dspine-data generate` writes) and the
// reader that serves them to training. A shard directory holds:
//   shard-00000.safetensors ...  input_ids [n, S] I64, loss_mask [n, S] I64,
//                                hidden_states [n, S, K*H] and target_last_hidden_states [n, S, H]
//                                (F32 or BF16); metadata seq_len, hidden_size, num_target_layers,
//                                target_layer_ids, sample_offset
//   target.safetensors           model.embed_tokens.weight and lm_head.weight, [V, H] F32
//   index.json                   layout, dtype, the shards in sample order and the size and
//                                SHA-256 of every file (version 2; docs/data.md)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/checksum.h"
#include "core/config.h"
#include "core/safetensors.h"
#include "data/batch_source.h"

namespace dspine::data {

// The dimensions a shard directory must agree with.
struct ShardLayout {
  int64_t seq_len = 0;
  int64_t hidden_size = 0;
  int64_t vocab_size = 0;
  std::vector<int64_t> target_layer_ids;  // K = size()
};
// data.seq_len with the draft's sizes and target layers (model.*).
ShardLayout shard_layout(const core::DataConfig& data, const core::ModelConfig& draft);

struct ShardEntry {
  std::string file;          // name inside the directory
  int64_t first_sample = 0;  // global index of its first sample within an epoch
  int64_t samples = 0;
  std::optional<core::FileDigest> digest;  // absent only in version 1 indexes
};

struct ShardIndex {
  ShardLayout layout;
  std::string dtype;  // fp32 | bf16: storage of hidden_states / target_last_hidden_states
  int64_t num_samples = 0;
  std::vector<ShardEntry> shards;
  std::optional<core::FileDigest> target_digest;  // of target.safetensors; absent in version 1
};

// Reads and checks dir/index.json (errors name the file and the bad entry).
ShardIndex read_shard_index(const std::string& dir);
// The same for index.json's text; `path` names it in errors.
ShardIndex parse_shard_index(const std::string& text, const std::string& path);

// Checks every file the index lists against its recorded size and SHA-256 (errors name the file:
// missing, truncated or corrupt; a version 1 index records none: a warning says so) and every
// shard's tensors as check_shard does, loading one shard at a time (errors name the file and the
// tensor).
void verify_shard_files(const std::string& dir, const ShardIndex& index);

// Checks shard `shard` of `index`, loaded from its file (tensor names, shapes, dtypes, sample
// offset, token range; errors name the file), and returns it with floating tensors as fp32.
core::SafetensorsFile check_shard(core::SafetensorsFile file, const ShardIndex& index,
                                  size_t shard);

struct ShardWriteOptions {
  int64_t num_samples = 1024;
  int64_t samples_per_shard = 256;
  std::string dtype = "fp32";  // fp32 | bf16
};

// Samples 0..num_samples-1 of `source` (built by make_batch_source from `data`: the synthetic
// target, or a real one with data.source target), of shapes `layout`, written into `out_dir`,
// which must not exist yet; the index records where they came from (data.source and its keys).
// Everything goes to the sibling `out_dir`.partial first, renamed to `out_dir` only when complete.
// Several ranks share the work through the three steps below.
void write_shards(BatchSource& source, const core::DataConfig& data, const ShardLayout& layout,
                  const std::string& out_dir, const ShardWriteOptions& options);

// The steps of write_shards, for ranks sharing the work (dspine-data generate under mpirun):
// rank 0 starts (checks `out_dir`, makes the .partial directory with target.safetensors, returns
// its path); after a barrier every rank writes its shards (shard i belongs to rank i mod world);
// after another barrier rank 0 finishes (checksums, index.json, rename).
std::string start_shards(const BatchSource& source, const std::string& out_dir,
                         const ShardWriteOptions& options);
void write_rank_shards(BatchSource& source, const ShardLayout& layout, const std::string& partial,
                       const ShardWriteOptions& options, int rank, int world_size);
void finish_shards(const core::DataConfig& data, const ShardLayout& layout,
                   const std::string& partial, const std::string& out_dir,
                   const ShardWriteOptions& options);
// The .partial sibling of `out_dir` that start_shards makes (errors: empty name).
std::string partial_dir(const std::string& out_dir);

// Serves a shard directory in sample order, wrapping around at the end (epochs). The index and
// target.safetensors are checked against `expected`, every file against its checksum and every
// shard's tensors (names, shapes, dtypes, sample count, token range) up front, so a damaged
// directory stops the run before training. Only the current shard is kept in memory.
class ShardReader : public BatchSource {
 public:
  ShardReader(const std::string& dir, const ShardLayout& expected);

  DraftBatch next(int64_t rows) override;
  int64_t cursor() const override { return cursor_; }
  void seek(int64_t cursor) override;
  at::Tensor embed_tokens() const override { return embed_tokens_; }
  at::Tensor lm_head() const override { return lm_head_; }
  int64_t distinct_samples() const override { return index_.num_samples; }
  std::string describe() const override { return "shards in " + dir_; }

  const ShardIndex& index() const { return index_; }

 private:
  const core::SafetensorsFile& load_shard(size_t shard);

  std::string dir_;
  ShardIndex index_;
  at::Tensor embed_tokens_, lm_head_;
  int64_t cursor_ = 0;
  std::optional<size_t> cached_shard_;
  core::SafetensorsFile cached_;
};

}  // namespace dspine::data
