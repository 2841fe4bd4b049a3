// data.source: specforge — SpecForge's offline samples, one torch.save file per sample
// (`<dir>/rows_<a>-<b>/data_<i>.ckpt`), read with LibTorch's pickle loader. Each is a dict with
// input_ids [S] and loss_mask [S] (or [1, S]), hidden_state [S, H] (the target's last hidden
// state) and aux_hidden_state [S, K*H] (the K target layers, concatenated), either with a
// leading batch dimension of 1. The frozen embedding and lm_head come from the target's Hugging
// Face directory (data.target.path). docs/data.md has the mapping.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/config.h"
#include "data/batch_source.h"
#include "data/shards.h"

namespace dspine::data {

// Sample files under `dir` (recursively: *.ckpt and *.pt), in SpecForge's sample order: by the
// number in data_<i>, then by path. Errors name `dir` when it is missing or holds none.
std::vector<std::string> list_specforge_samples(const std::string& dir);

// One sample file as a [1, seq_len] row of a DraftBatch (fp32 hidden states): cut to seq_len
// or padded with token 0, loss 0 and zero hidden states. A missing key, a wrong shape or dtype,
// or a token outside the vocabulary is an error naming the file and the key.
DraftBatch read_specforge_sample(const std::string& path, const ShardLayout& layout);

// Checks every file in `files` as read_specforge_sample does (keys, shapes, dtypes, token range,
// loss mask), one file in memory at a time; errors name the file and the key.
void check_specforge_samples(const std::vector<std::string>& files, const ShardLayout& layout);

// A Hugging Face model directory's model.embed_tokens.weight and lm_head.weight (the embedding
// again when tied), [V, H] fp32, read from model.safetensors or the files its index names.
std::pair<at::Tensor, at::Tensor> read_hf_head_weights(const std::string& dir,
                                                       const ShardLayout& layout);

// Both constructors check every sample file (check_specforge_samples), so a bad one stops the
// run before training; next() reads the files again as their samples are asked for.
class SpecforgeSource : public BatchSource {
 public:
  // data.specforge_dir, with the target's tables from data.target.path; the samples' shapes
  // from shard_layout(data, draft).
  SpecforgeSource(const core::DataConfig& data, const core::ModelConfig& draft);
  // The same target's tables over another sample directory: the held-out source of
  // data.eval_specforge_dir.
  SpecforgeSource(const SpecforgeSource& training, const std::string& dir);

  DraftBatch next(int64_t rows) override;
  int64_t cursor() const override { return cursor_; }
  void seek(int64_t cursor) override;
  at::Tensor embed_tokens() const override { return embed_tokens_; }
  at::Tensor lm_head() const override { return lm_head_; }
  int64_t distinct_samples() const override { return static_cast<int64_t>(files_.size()); }
  std::string describe() const override { return "SpecForge samples in " + dir_; }

 private:
  std::string dir_;
  ShardLayout layout_;
  std::vector<std::string> files_;
  at::Tensor embed_tokens_, lm_head_;
  int64_t cursor_ = 0;
};

}  // namespace dspine::data
