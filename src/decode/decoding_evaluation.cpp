#include "decode/decoding_evaluation.h"

#include <ATen/ATen.h>

#include "decode/block_drafter.h"
#include "decode/regeneration.h"
#include "decode/speculative_decoder.h"

namespace dspine::decode {
namespace {

// The prompt of each row of `batch`, its ids and loss mask read from the device once.
std::vector<std::vector<int64_t>> batch_prompts(const data::DraftBatch& batch,
                                                int64_t prompt_tokens) {
  const auto ids = batch.input_ids.to(at::kCPU).to(at::kLong).contiguous();
  const auto mask = batch.loss_mask_on_host().to(at::kLong).contiguous();
  const int64_t width = ids.size(1);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t b = 0; b < batch.rows(); ++b) {
    const int64_t* id = ids.data_ptr<int64_t>() + b * width;
    const int64_t* supervised = mask.data_ptr<int64_t>() + b * width;
    const data::TokenSample row{{id, id + width}, {supervised, supervised + width}};
    prompts.push_back(sample_prompt(row, prompt_tokens));
  }
  return prompts;
}

}  // namespace

std::map<std::string, double> decoding_metrics(const target::Qwen3Model& target,
                                               model::DSpineDraft draft,
                                               const std::vector<data::DraftBatch>& batches,
                                               const DecodingEvaluationSettings& settings,
                                               dist::Communicator& comm) {
  at::NoGradGuard no_grad;
  BlockDrafter drafter(draft, target.embed_tokens(), target.lm_head());
  const int64_t slots = drafter.proposals();
  // [verifications, generated, accepted at position 1..T], summed over batches and ranks.
  auto counts = at::zeros({2 + slots}, at::kDouble);
  DecodeSettings decode;
  decode.max_new_tokens = settings.new_tokens;
  decode.temperature = settings.temperature;
  for (size_t i = 0; i < batches.size(); ++i) {
    const auto prompts = batch_prompts(batches[i], settings.prompt_tokens);
    decode.seed = settings.seed + (static_cast<uint64_t>(comm.rank()) << 32) + i;
    const auto result = SpeculativeDecoder(target, &drafter, decode).decode(prompts);
    counts[0] += static_cast<double>(result.verifications);
    counts[1] += static_cast<double>(result.generated);
    for (int64_t k = 0; k < slots; ++k) {
      counts[2 + k] += static_cast<double>(result.accepted_by_position[k]);
    }
  }
  comm.all_reduce(counts);
  const double verifications = counts[0].item<double>();
  std::map<std::string, double> metrics;
  metrics[kDecodeTauMetric] = verifications > 0 ? counts[1].item<double>() / verifications : 0.0;
  metrics[kDecodeTokensMetric] = counts[1].item<double>();
  for (int64_t k = 0; k < slots; ++k) {
    metrics["decode_accept_" + std::to_string(k + 1)] =
        verifications > 0 ? counts[2 + k].item<double>() / verifications : 0.0;
  }
  return metrics;
}

}  // namespace dspine::decode
