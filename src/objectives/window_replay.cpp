#include "objectives/window_replay.h"

#include <torch/torch.h>

#include <mutex>

#include "core/error.h"

namespace dspine::objectives {

at::Tensor generator_state(at::Generator& generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

GeneratorFork::GeneratorFork(at::Generator& generator, const at::Tensor& state)
    : generator_(generator), saved_(generator_state(generator)) {
  std::lock_guard<std::mutex> lock(generator_.mutex());
  generator_.set_state(state);
}

GeneratorFork::~GeneratorFork() {
  std::lock_guard<std::mutex> lock(generator_.mutex());
  generator_.set_state(saved_);
}

void WindowReplay::begin(int64_t received, int64_t expected) {
  if (active()) {
    fail(
        "DSpine window opened while the previous one has {} of {} micro-batches replayed; "
        "incomplete gradient accumulation",
        replayed_, expected_);
  }
  if (received != expected) {
    fail(
        "training stream ended with incomplete gradient accumulation: received {} of {} "
        "micro-batches after the last optimizer step; no partial optimizer step or durable "
        "acknowledgement was committed",
        received, expected);
  }
  expected_ = expected;
  replayed_ = 0;
  reduced_ = false;
}

void WindowReplay::record_prepass(at::Tensor rng_state, double ce, double denominator) {
  if (static_cast<int64_t>(prepasses_.size()) >= expected_) {
    fail("DSpine window: more prepasses than its {} micro-batches", expected_);
  }
  prepasses_.push_back({std::move(rng_state), ce, denominator});
}

void WindowReplay::reduce(dist::Communicator& comm) {
  if (static_cast<int64_t>(prepasses_.size()) != expected_) {
    fail("DSpine window reduced after {} of {} prepasses", prepasses_.size(), expected_);
  }
  double ce = 0, denominator = 0;
  for (const auto& p : prepasses_) {
    ce += p.ce;
    denominator += p.denominator;
  }
  auto totals = torch::tensor({ce, denominator}, torch::kFloat64);
  comm.all_reduce(totals);
  global_ce_ = totals[0].item<double>();
  global_denominator_ = totals[1].item<double>();
  if (!(global_denominator_ > 0)) fail("DSpine has no supervised proposal tokens");
  reduced_ = true;
}

const at::Tensor& WindowReplay::replay_state(int64_t index) {
  if (!reduced_) fail("DSpine replay of micro-batch {} before the window's prepass", index);
  if (index != replayed_) {
    fail("DSpine replay out of order: micro-batch {} requested, {} expected", index, replayed_);
  }
  return prepasses_[index].rng_state;
}

void WindowReplay::finish_replay(int64_t index, double denominator) {
  if (denominator != prepasses_[index].denominator) {
    fail(
        "DSpine replay of micro-batch {} drew different blocks than its prepass (D {} vs {}); "
        "was a different batch passed?",
        index, denominator, prepasses_[index].denominator);
  }
  ++replayed_;
}

void WindowReplay::check_immediate() const {
  if (active()) fail("Cannot mix immediate and replayed losses in one window");
}

void WindowReplay::end() {
  if (replayed_ != expected_ || static_cast<int64_t>(prepasses_.size()) != expected_) {
    fail(
        "DSpine window ended with incomplete gradient accumulation: {} of {} micro-batches "
        "replayed",
        replayed_, expected_);
  }
  prepasses_.clear();
  replayed_ = 0;
  reduced_ = false;
}

}  // namespace dspine::objectives
