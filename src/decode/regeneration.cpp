#include "decode/regeneration.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "target/hf_checkpoint.h"

namespace dspine::decode {

std::vector<int64_t> sample_prompt(const data::TokenSample& sample, int64_t prompt_tokens) {
  int64_t length = static_cast<int64_t>(sample.input_ids.size());
  if (prompt_tokens > 0) {
    length = std::min(length, prompt_tokens);
  } else {
    const auto first = std::find(sample.loss_mask.begin(), sample.loss_mask.end(), 1);
    length = std::max<int64_t>(1, first - sample.loss_mask.begin());
  }
  return {sample.input_ids.begin(), sample.input_ids.begin() + length};
}

std::vector<int64_t> eos_token_ids(const std::string& target_dir) {
  const auto json =
      target::read_hf_config_json((std::filesystem::path(target_dir) / "config.json").string());
  const auto eos = json.value("eos_token_id", nlohmann::json());
  std::vector<int64_t> ids;
  if (eos.is_number_integer()) ids.push_back(eos.get<int64_t>());
  for (const auto& id : eos.is_array() ? eos : nlohmann::json::array()) {
    if (id.is_number_integer()) ids.push_back(id.get<int64_t>());
  }
  return ids;
}

int64_t decode_weight_bytes(const target::Qwen3Dims& d, at::ScalarType dtype) {
  const int64_t q = d.num_attention_heads * d.head_dim, kv = d.num_key_value_heads * d.head_dim;
  const int64_t layer = d.hidden_size * (q + 2 * kv) + q * d.hidden_size +
                        3 * d.hidden_size * d.intermediate_size + 2 * d.hidden_size +
                        2 * d.head_dim;
  const int64_t elements =
      d.num_hidden_layers * layer + d.hidden_size + d.vocab_size * d.hidden_size;
  return elements * static_cast<int64_t>(c10::elementSize(dtype));
}

RegenerationReport regenerate(const target::Qwen3Model& target, data::TokenSamples& samples,
                              int64_t first, int64_t count, int64_t prompt_tokens, int64_t batch,
                              const DecodeSettings& settings, const std::string& out_path) {
  namespace fs = std::filesystem;
  if (fs::exists(out_path)) fail("regenerate: {} exists; give a new file", out_path);
  if (batch < 1) fail("regenerate: the batch must be at least 1 (got {})", batch);
  const std::string partial = out_path + ".partial";
  std::ofstream out(partial);
  if (!out) fail("regenerate: cannot write {}", partial);
  SpeculativeDecoder decoder(target, nullptr, settings);
  RegenerationReport report;
  for (int64_t begin = 0; begin < count; begin += batch) {
    std::vector<std::vector<int64_t>> prompts;
    for (int64_t i = begin; i < std::min(count, begin + batch); ++i) {
      prompts.push_back(sample_prompt(samples.read(first + i), prompt_tokens));
    }
    // On CUDA the first batch runs once untimed: the device's warm-up (lazily loaded kernels, the
    // libraries' first choices for each shape) costs seconds, which the rate would otherwise
    // count as decoding.
    if (begin == 0 && target.embed_tokens().is_cuda()) decoder.decode(prompts);
    const auto result = decoder.decode(prompts);
    report.seconds += result.seconds;
    size_t rounds = 0;  // the batch's forwards after its prefill: its longest row's
    for (const auto& row : result.rows) rounds = std::max(rounds, row.accepted.size());
    report.forwards += 1 + static_cast<int64_t>(rounds);
    for (size_t r = 0; r < prompts.size(); ++r) {
      const auto& continuation = result.rows[r].tokens;
      nlohmann::json line;
      std::vector<int64_t> ids = prompts[r];
      ids.insert(ids.end(), continuation.begin(), continuation.end());
      std::vector<int64_t> mask(prompts[r].size(), 0);
      mask.resize(ids.size(), 1);
      line["input_ids"] = ids;
      line["loss_mask"] = mask;
      out << line.dump() << "\n";
      report.prompt_tokens += static_cast<int64_t>(prompts[r].size());
      report.generated_tokens += static_cast<int64_t>(continuation.size());
    }
    report.samples += static_cast<int64_t>(prompts.size());
  }
  out.close();
  if (!out) fail("regenerate: writing {} failed", partial);
  fs::rename(partial, out_path);
  return report;
}

}  // namespace dspine::decode
