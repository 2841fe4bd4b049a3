#include "decode/speculative_decoder.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "core/device_generator.h"
#include "core/error.h"
#include "core/row_spans.h"
#include "decode/round_graph.h"
#include "decode/verification.h"

namespace dspine::decode {

namespace {

void synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

constexpr int64_t kCapacityStep = 64;  // cache positions
int64_t round_up(int64_t value, int64_t step) { return (value + step - 1) / step * step; }

}  // namespace

double DecodeResult::tau() const {
  return verifications > 0 ? static_cast<double>(generated) / static_cast<double>(verifications)
                           : 0.0;
}

SpeculativeDecoder::SpeculativeDecoder(const target::Qwen3Model& target, Drafter* drafter,
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

// The buffers of a batch's decoding, kept between decode() calls of the same batch and capacity:
// both caches, each row's length and pending token, the draws, and the captured round. A round's
// device work (run_round) has fixed shapes and reads nothing back, so on CUDA it runs as a CUDA
// graph; the host then reads the round's outcome once (record).
class SpeculativeDecoder::Session {
 public:
  Session(const target::Qwen3Model& target, Drafter* drafter, const DecodeSettings& settings,
          int64_t batch, int64_t capacity)
      : target_(target),
        drafter_(drafter),
        settings_(settings),
        device_(target.embed_tokens().device()),
        dtype_(target.embed_tokens().scalar_type()),
        vocab_(target.dims().vocab_size),
        slots_(drafter != nullptr ? drafter->proposals() : 0),
        batch_(batch),
        capacity_(capacity),
        draws_{settings.temperature, core::seeded_generator(device_, settings.seed)},
        graph_(device_, settings.cuda_graphs, draws_.generator) {
    if (drafter_ != nullptr) layer_ids_ = drafter_->target_layer_ids();
    RoundGraph::OnItsStream on_its_stream(graph_);  // the buffers belong to its stream
    const auto longs = at::TensorOptions().dtype(at::kLong).device(device_);
    cache_ = target_.new_cache(batch, capacity);
    device_lengths_ = at::zeros({batch}, longs);
    if (drafter_ != nullptr) {
      // [pending | T drafts | sentinel]: the verification reads its first T + 1 columns and the
      // greedy verdict its last T + 1 (verify_greedy), with no concatenation in between.
      block_ids_ = at::full({batch, slots_ + 2}, -1, longs);
      pending_ = block_ids_.select(1, 0);
    } else {
      pending_ = at::zeros({batch}, longs);
    }
    device_active_ = at::zeros({batch}, longs);
    outcome_ = at::zeros({batch, slots_ + 2}, longs);
  }

  bool fits(int64_t batch, int64_t capacity) const {
    return batch == batch_ && capacity == capacity_;
  }
  RoundGraph& graph() { return graph_; }

  // The target runs every prompt into its cache (right-padded with token 0, which no row reads)
  // and chooses each row's first token. The prompts are checked and fit the capacity.
  void prefill(const std::vector<std::vector<int64_t>>& prompts, DecodeResult& result) {
    result_ = &result;
    draws_.generator.set_current_seed(settings_.seed);  // each call draws as a fresh one would
    lengths_.clear();
    for (const auto& prompt : prompts) lengths_.push_back(static_cast<int64_t>(prompt.size()));
    const int64_t longest = *std::max_element(lengths_.begin(), lengths_.end());
    auto ids = at::zeros({batch_, longest}, at::kLong);
    for (int64_t b = 0; b < batch_; ++b) {
      std::copy(prompts[b].begin(), prompts[b].end(), ids[b].data_ptr<int64_t>());
    }
    const auto out =
        target_.step_rows(ids.to(device_), cache_, std::vector<int64_t>(batch_, 0), layer_ids_);
    if (drafter_ != nullptr) {
      if (!drafter_->start(batch_, capacity_)) graph_.forget();  // its buffers moved
      drafter_->extend(out.hidden_states,
                       core::row_spans(std::vector<int64_t>(batch_, 0), longest, device_, dtype_));
    }
    device_lengths_.copy_(at::tensor(lengths_, at::kLong));
    const auto last = device_lengths_.sub(1);
    const auto states = out.last_hidden_state.gather(
        1, last.view({batch_, 1, 1}).expand({batch_, 1, out.last_hidden_state.size(-1)}));
    pending_.copy_(choose(target_.logits(states.squeeze(1))));
    device_active_.fill_(1);
    const auto first = pending_.to(at::kCPU);
    active_.assign(batch_, true);
    for (int64_t b = 0; b < batch_; ++b) take(b, {first[b].item<int64_t>()});
  }

  bool any_active() const {
    return std::find(active_.begin(), active_.end(), true) != active_.end();
  }

  // One round: the draft's block, the target's verdict on it, each row's share.
  void round() {
    // Captured, attention reads the whole capacity (masked), so every round has one shape.
    const int64_t keys = graph_.captures()
                             ? capacity_
                             : *std::max_element(lengths_.begin(), lengths_.end()) + slots_ + 1;
    graph_.run([&] { run_round(keys); });
    result_->rounds += 1;
    record();
  }

 private:
  bool greedy() const { return settings_.temperature == 0.0; }
  at::Tensor probs(const at::Tensor& logits) const {
    return at::softmax(logits.to(at::kFloat) / settings_.temperature, -1);
  }
  at::Tensor choose(const at::Tensor& logits) {  // [B, V] -> [B]
    return greedy() ? logits.argmax(-1) : sample_rows(probs(logits), draws_.generator);
  }

  // A round's device work, attention over the first `keys` cached positions: it updates the
  // rows' lengths and pending tokens in place and writes the round's outcome_. The block's
  // positions (the pending token's, then the drafts') serve the draft, the target's verification
  // and the draft's new context alike.
  void run_round(int64_t keys) {
    const int64_t batch = batch_;
    const auto spans = core::row_spans(device_lengths_, slots_ + 1, keys, dtype_);
    const auto drafted = drafter_ != nullptr ? draft(spans) : DraftedBlock();
    if (drafter_ != nullptr) block_ids_.narrow(1, 1, slots_).copy_(drafted.tokens);
    const auto block =
        drafter_ != nullptr ? block_ids_.narrow(1, 0, slots_ + 1) : pending_.view({batch, 1});
    const auto out = target_.step_rows(block, cache_, spans, layer_ids_);
    // The target's verdict, then each row's new state: the pending token and the accepted drafts
    // are now cached, and the target's own token is next. A row that ended keeps its length (its
    // later rounds write past what it reads).
    const auto judge = [&] {
      const auto logits = target_.logits(out.last_hidden_state);  // [B, T + 1, V]
      Verdict verdict;
      if (drafter_ == nullptr) {
        verdict.accepted = at::zeros({batch}, at::TensorOptions().dtype(at::kLong).device(device_));
        verdict.tokens = choose(logits.select(1, 0)).view({batch, 1});
      } else if (greedy()) {
        verdict = verify_greedy(logits, block_ids_.narrow(1, 1, slots_ + 1));
      } else {
        verdict = verify_sampled(probs(logits), drafted.probs, drafted.tokens, draws_.generator);
      }
      device_lengths_.add_(verdict.accepted.add(1).mul_(device_active_));
      pending_.copy_(verdict.tokens.gather(1, verdict.accepted.view({batch, 1})).view({batch}));
      outcome_.select(1, 0).copy_(verdict.accepted);
      outcome_.narrow(1, 1, slots_ + 1).copy_(verdict.tokens);
    };
    if (drafter_ == nullptr) {
      judge();
    } else {
      // The whole block's hidden states go into the draft's cache (those of rejected drafts are
      // written over next round) beside the verdict and the state updates: the draft's cache
      // needs only the verification's forward and the positions it was given, which the updates
      // do not touch.
      graph_.beside([&] { drafter_->extend(out.hidden_states, spans); }, judge);
    }
  }

  // The drafted block, its shapes checked.
  DraftedBlock draft(const core::RowSpans& spans) {
    const int64_t batch = batch_;
    auto block = drafter_->propose(spans, pending_, draws_);
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

  // Each active row keeps its accepted tokens and the target's own, from the round's outcome:
  // the round's one read back from the device.
  void record() {
    const auto outcome = outcome_.to(at::kCPU);
    bool ended = false;
    for (size_t b = 0; b < lengths_.size(); ++b) {
      if (!active_[b]) continue;
      const int64_t* row = outcome[b].data_ptr<int64_t>();
      const int64_t k = row[0];
      const int64_t kept = take(b, std::vector<int64_t>(row + 1, row + k + 2));
      result_->rows[b].accepted.push_back(kept);
      result_->verifications += 1;
      result_->generated += kept;
      for (int64_t j = 0; j < std::min(k, slots_); ++j) result_->accepted_by_position[j] += 1;
      lengths_[b] += k + 1;  // as on the device
      ended = ended || !active_[b];
    }
    if (ended) {
      const std::vector<int64_t> active(active_.begin(), active_.end());
      device_active_.copy_(at::tensor(active, at::kLong));
    }
  }

  // Appends `given` to row b until a stop token or the length limit ends the row; returns how
  // many it kept.
  int64_t take(size_t b, const std::vector<int64_t>& given) {
    auto& tokens = result_->rows[b].tokens;
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

  const target::Qwen3Model& target_;
  Drafter* drafter_;
  const DecodeSettings& settings_;
  DecodeResult* result_ = nullptr;  // the call's
  c10::Device device_;
  at::ScalarType dtype_;  // the target's, the spans' bias
  int64_t vocab_, slots_, batch_, capacity_;
  DraftDraws draws_;  // the draft's and the verification's draws share one generator
  RoundGraph graph_;
  std::vector<int64_t> layer_ids_;
  target::Qwen3Model::KvCache cache_;
  // On the device, updated in place by every round ([B] int64): each row's cached positions, its
  // next token (chosen by the target, not yet cached; with a draft, column 0 of block_ids_), 1
  // while it is active; and the round's outcome [B, T + 2]: the accepted drafts' count, then the
  // tokens of verification.h's Verdict.
  at::Tensor device_lengths_, pending_, device_active_, outcome_;
  at::Tensor block_ids_;          // with a draft: [B, T + 2], the pending token, the drafts, -1
  std::vector<int64_t> lengths_;  // device_lengths_ on the host
  std::vector<bool> active_;
};

SpeculativeDecoder::~SpeculativeDecoder() = default;

DecodeResult SpeculativeDecoder::decode(const std::vector<std::vector<int64_t>>& prompts) {
  at::NoGradGuard no_grad;
  const auto started = std::chrono::steady_clock::now();
  DecodeResult result;
  result.rows.resize(prompts.size());
  result.accepted_by_position.assign(drafter_ != nullptr ? drafter_->proposals() : 0, 0);
  if (prompts.empty()) return result;
  const int64_t vocab = target_.dims().vocab_size;
  int64_t longest = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    if (prompts[b].empty()) fail("decoding: prompt {} is empty", b);
    for (int64_t id : prompts[b]) {
      if (id < 0 || id >= vocab)
        fail("decoding: prompt {} holds id {} outside [0, {})", b, id, vocab);
    }
    longest = std::max(longest, static_cast<int64_t>(prompts[b].size()));
  }
  // A row that ends in a round still advances by that round's tokens on the device, and its later
  // rounds write a block past that: room for two blocks beyond the longest output. Rounded up, so
  // that batches of similar prompts share the buffers and the captured round.
  const int64_t slots = drafter_ != nullptr ? drafter_->proposals() : 0;
  const int64_t capacity =
      round_up(longest + settings_.max_new_tokens + 2 * (slots + 1), kCapacityStep);
  const int64_t batch = static_cast<int64_t>(prompts.size());
  if (session_ == nullptr || !session_->fits(batch, capacity)) {
    session_.reset();  // its memory first
    session_ = std::make_unique<Session>(target_, drafter_, settings_, batch, capacity);
  }
  {
    RoundGraph::OnItsStream on_its_stream(session_->graph());
    session_->prefill(prompts, result);
    while (session_->any_active()) session_->round();
  }
  result.cuda_graphs = session_->graph().captures();
  synchronize(target_.embed_tokens().device());
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

}  // namespace dspine::decode
