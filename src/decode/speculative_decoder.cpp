#include "decode/speculative_decoder.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "core/device_generator.h"
#include "core/error.h"
#include "decode/verification.h"

namespace dspine::decode {

namespace {

void synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

}  // namespace

double DecodeResult::tau() const {
  return verifications > 0 ? static_cast<double>(generated) / static_cast<double>(verifications)
                           : 0.0;
}

SpeculativeDecoder::SpeculativeDecoder(const data::Qwen3Model& target, Drafter* drafter,
                                       DecodeSettings settings)
    : target_(target), drafter_(drafter), settings_(std::move(settings)) {
  if (settings_.max_new_tokens < 1) {
    fail("decoding: max_new_tokens must be at least 1 (got {})", settings_.max_new_tokens);
  }
  if (!(settings_.temperature >= 0.0) || settings_.temperature > 1e4) {
    fail("decoding: temperature must be in [0, 1e4] (got {})", settings_.temperature);
  }
  if (drafter_ != nullptr && drafter_->target_layer_ids().empty()) {
    fail("decoding: the draft reads no target layer");
  }
}

// One decode() call: the batch's cache, each row's length and pending token, and the draws.
class SpeculativeDecoder::Session {
 public:
  Session(const data::Qwen3Model& target, Drafter* drafter, const DecodeSettings& settings,
          DecodeResult& result)
      : target_(target),
        drafter_(drafter),
        settings_(settings),
        result_(result),
        device_(target.embed_tokens().device()),
        vocab_(target.dims().vocab_size),
        slots_(drafter != nullptr ? drafter->proposals() : 0),
        draws_{settings.temperature, core::seeded_generator(device_, settings.seed)} {
    if (drafter_ != nullptr) layer_ids_ = drafter_->target_layer_ids();
  }

  // The target runs every prompt into its cache (right-padded with token 0, which no row reads)
  // and chooses each row's first token.
  void prefill(const std::vector<std::vector<int64_t>>& prompts) {
    const int64_t batch = static_cast<int64_t>(prompts.size());
    int64_t longest = 0;
    for (int64_t b = 0; b < batch; ++b) {
      if (prompts[b].empty()) fail("decoding: prompt {} is empty", b);
      for (int64_t id : prompts[b]) {
        if (id < 0 || id >= vocab_)
          fail("decoding: prompt {} holds id {} outside [0, {})", b, id, vocab_);
      }
      lengths_.push_back(static_cast<int64_t>(prompts[b].size()));
      longest = std::max(longest, lengths_.back());
    }
    const int64_t capacity = longest + settings_.max_new_tokens + slots_ + 1;
    cache_ = target_.new_cache(batch, capacity);
    auto ids = at::zeros({batch, longest}, at::kLong);
    for (int64_t b = 0; b < batch; ++b) {
      std::copy(prompts[b].begin(), prompts[b].end(), ids[b].data_ptr<int64_t>());
    }
    const auto out =
        target_.step_rows(ids.to(device_), cache_, std::vector<int64_t>(batch, 0), layer_ids_);
    if (drafter_ != nullptr) {
      drafter_->start(batch, capacity);
      drafter_->extend(out.hidden_states, std::vector<int64_t>(batch, 0));
    }
    const auto last = at::tensor(lengths_, at::kLong).sub(1).to(device_);
    const auto states = out.last_hidden_state.gather(
        1, last.view({batch, 1, 1}).expand({batch, 1, out.last_hidden_state.size(-1)}));
    pending_ = choose(target_.logits(states.squeeze(1)));
    const auto first = pending_.to(at::kCPU);
    active_.assign(batch, true);
    for (int64_t b = 0; b < batch; ++b) take(b, {first[b].item<int64_t>()});
  }

  bool any_active() const {
    return std::find(active_.begin(), active_.end(), true) != active_.end();
  }

  // One round: the draft's block, the target's verdict on it, each row's share.
  void round() {
    const int64_t batch = static_cast<int64_t>(lengths_.size());
    const auto drafted = drafter_ != nullptr ? draft() : DraftedBlock();
    const auto block = drafter_ != nullptr
                           ? at::cat({pending_.view({batch, 1}), drafted.tokens}, 1)
                           : pending_.view({batch, 1});
    const auto out = target_.step_rows(block, cache_, lengths_, layer_ids_);
    const auto logits = target_.logits(out.last_hidden_state);  // [B, T + 1, V]
    Verdict verdict;
    if (drafter_ == nullptr) {
      verdict.accepted = at::zeros({batch}, at::TensorOptions().dtype(at::kLong).device(device_));
      verdict.tokens = choose(logits.select(1, 0)).view({batch, 1});
    } else if (greedy()) {
      verdict = verify_greedy(logits, drafted.tokens);
    } else {
      verdict = verify_sampled(probs(logits), drafted.probs, drafted.tokens, draws_.generator);
    }
    // The whole block's hidden states: those of rejected drafts are written over next round.
    if (drafter_ != nullptr) drafter_->extend(out.hidden_states, lengths_);
    record(verdict);
  }

 private:
  bool greedy() const { return settings_.temperature == 0.0; }
  at::Tensor probs(const at::Tensor& logits) const {
    return at::softmax(logits.to(at::kFloat) / settings_.temperature, -1);
  }
  at::Tensor choose(const at::Tensor& logits) {  // [B, V] -> [B]
    return greedy() ? logits.argmax(-1) : sample_rows(probs(logits), draws_.generator);
  }

  // The drafted block, its shapes checked.
  DraftedBlock draft() {
    const int64_t batch = static_cast<int64_t>(lengths_.size());
    auto block = drafter_->propose(lengths_, pending_, draws_);
    const bool fits = block.tokens.sizes() == at::IntArrayRef({batch, slots_}) &&
                      (greedy() || block.probs.sizes() == at::IntArrayRef({batch, slots_, vocab_}));
    if (!fits) {
      const auto shape = [](const at::Tensor& t) {
        return t.defined() ? "[" + c10::str(t.sizes()) + "]" : std::string("none");
      };
      fail("decoding: the draft gave tokens {} and distributions {}, not [{}, {}] and [{}, {}, {}]",
           shape(block.tokens), shape(block.probs), batch, slots_, batch, slots_, vocab_);
    }
    return block;
  }

  // Each active row keeps its accepted tokens and the target's own; that one becomes pending.
  void record(const Verdict& verdict) {
    const auto accepted = verdict.accepted.to(at::kCPU);
    const auto tokens = verdict.tokens.to(at::kCPU);
    auto next = pending_.to(at::kCPU).clone();
    for (size_t b = 0; b < lengths_.size(); ++b) {
      if (!active_[b]) continue;
      const int64_t k = accepted[b].item<int64_t>();
      const int64_t* row = tokens[b].data_ptr<int64_t>();
      const int64_t kept = take(b, std::vector<int64_t>(row, row + k + 1));
      result_.rows[b].accepted.push_back(kept);
      result_.verifications += 1;
      result_.generated += kept;
      for (int64_t j = 0; j < std::min(k, slots_); ++j) result_.accepted_by_position[j] += 1;
      // The pending token and the k accepted drafts are now cached. An ended row stays where it
      // is (its later rounds write past what it reads).
      if (active_[b]) lengths_[b] += k + 1;
      next[b] = row[k];
    }
    pending_ = next.to(device_);
  }

  // Appends `given` to row b until a stop token or the length limit ends the row; returns how
  // many it kept.
  int64_t take(size_t b, const std::vector<int64_t>& given) {
    auto& tokens = result_.rows[b].tokens;
    int64_t kept = 0;
    for (int64_t token : given) {
      tokens.push_back(token);
      ++kept;
      const auto& stops = settings_.stop_tokens;
      if (std::find(stops.begin(), stops.end(), token) != stops.end() ||
          static_cast<int64_t>(tokens.size()) >= settings_.max_new_tokens) {
        active_[b] = false;
        break;
      }
    }
    return kept;
  }

  const data::Qwen3Model& target_;
  Drafter* drafter_;
  const DecodeSettings& settings_;
  DecodeResult& result_;
  c10::Device device_;
  int64_t vocab_, slots_;
  DraftDraws draws_;  // the draft's and the verification's draws share one generator
  std::vector<int64_t> layer_ids_;
  data::Qwen3Model::KvCache cache_;
  at::Tensor pending_;  // [B]: each row's next token, chosen by the target, not yet cached
  std::vector<int64_t> lengths_;  // each row's cached positions
  std::vector<bool> active_;
};

DecodeResult SpeculativeDecoder::decode(const std::vector<std::vector<int64_t>>& prompts) {
  at::NoGradGuard no_grad;
  const auto started = std::chrono::steady_clock::now();
  DecodeResult result;
  result.rows.resize(prompts.size());
  result.accepted_by_position.assign(drafter_ != nullptr ? drafter_->proposals() : 0, 0);
  if (prompts.empty()) return result;
  Session session(target_, drafter_, settings_, result);
  session.prefill(prompts);
  while (session.any_active()) session.round();
  synchronize(target_.embed_tokens().device());
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

}  // namespace dspine::decode
