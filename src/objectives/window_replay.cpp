#include "objectives/window_replay.h"

#include <torch/torch.h>

#include "core/error.h"

namespace dspine::objectives {

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

void WindowReplay::record_prepass(double ce, double denominator) {
  if (static_cast<int64_t>(prepasses_.size()) >= expected_) {
    fail("DSpine window: more prepasses than its {} micro-batches", expected_);
  }
  prepasses_.push_back({ce, denominator, false});
}

void WindowReplay::record_deferred() {
  if (!prepasses_.empty()) fail("DSpine window: only its first micro-batch can skip the prepass");
  prepasses_.push_back({0, 0, true});
}

at::Tensor WindowReplay::prepassed_totals() const {
  double ce = 0, denominator = 0;
  for (const auto& p : prepasses_) {
    ce += p.ce;
    denominator += p.denominator;
  }
  return torch::tensor({ce, denominator}, torch::kFloat64);
}

void WindowReplay::reduce(dist::Communicator& comm) {
  if (static_cast<int64_t>(prepasses_.size()) != expected_) {
    fail("DSpine window reduced after {} of {} prepasses", prepasses_.size(), expected_);
  }
  if (deferred(0)) fail("DSpine window with a deferred micro-batch is reduced by its replay");
  auto totals = prepassed_totals();
  comm.all_reduce(totals);
  complete(totals[0].item<double>(), totals[1].item<double>());
}

void WindowReplay::complete(double global_ce, double global_denominator) {
  global_ce_ = global_ce;
  global_denominator_ = global_denominator;
  if (!(global_denominator_ > 0)) fail("DSpine has no supervised proposal tokens");
  reduced_ = true;
}

bool WindowReplay::deferred(int64_t index) const {
  return index >= 0 && index < static_cast<int64_t>(prepasses_.size()) &&
         prepasses_[index].deferred;
}

void WindowReplay::begin_replay(int64_t index) const {
  if (static_cast<int64_t>(prepasses_.size()) != expected_) {
    fail("DSpine replay of micro-batch {} before the window's prepass", index);
  }
  if (!reduced_ && !deferred(index)) {
    fail("DSpine replay of micro-batch {} before the window's reduction", index);
  }
  if (index != replayed_) {
    fail("DSpine replay out of order: micro-batch {} requested, {} expected", index, replayed_);
  }
}

void WindowReplay::finish_replay(int64_t index, double denominator) {
  if (!reduced_) {
    fail("DSpine replay of micro-batch {} finished before the window's reduction", index);
  }
  if (!prepasses_[index].deferred && denominator != prepasses_[index].denominator) {
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
