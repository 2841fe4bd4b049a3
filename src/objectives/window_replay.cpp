#include "objectives/window_replay.h"

#include <torch/torch.h>

#include "core/error.h"

namespace dspine::objectives {
namespace {

at::Tensor f64(const at::Tensor& t) { return t.detach().to(torch::kFloat64); }

}  // namespace

void check_supervised(double global_denominator) {
  if (!(global_denominator > 0)) fail("DSpine has no supervised proposal tokens");
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

void WindowReplay::record_prepass(const at::Tensor& ce, const at::Tensor& denominator) {
  if (static_cast<int64_t>(prepasses_.size()) >= expected_) {
    fail("DSpine window: more prepasses than its {} micro-batches", expected_);
  }
  prepasses_.push_back({f64(ce), f64(denominator), at::Tensor()});
}

void WindowReplay::record_deferred() {
  if (!prepasses_.empty()) fail("DSpine window: only its first micro-batch can skip the prepass");
  prepasses_.push_back({});
}

at::Tensor WindowReplay::prepassed_totals() const {
  at::Tensor ce, denominator;
  for (const auto& p : prepasses_) {
    if (!p.ce.defined()) continue;
    ce = ce.defined() ? ce + p.ce : p.ce;
    denominator = denominator.defined() ? denominator + p.denominator : p.denominator;
  }
  if (!ce.defined()) return torch::zeros({2}, torch::kFloat64);
  return torch::stack({ce, denominator});
}

void WindowReplay::reduce(dist::Communicator& comm) {
  if (static_cast<int64_t>(prepasses_.size()) != expected_) {
    fail("DSpine window reduced after {} of {} prepasses", prepasses_.size(), expected_);
  }
  if (deferred(0)) fail("DSpine window with a deferred micro-batch is reduced by its replay");
  auto totals = prepassed_totals();
  if (!comm.reduces_device_tensors()) totals = totals.cpu();
  comm.all_reduce(totals);
  complete(totals[0], totals[1]);
}

void WindowReplay::complete(const at::Tensor& global_ce, const at::Tensor& global_denominator) {
  global_ce_ = f64(global_ce);
  global_denominator_ = f64(global_denominator);
  // A value on the host costs nothing to check now; one on the GPU waits for end().
  if (!global_denominator_.is_cuda()) check_supervised(global_denominator_.item<double>());
  reduced_ = true;
}

at::Tensor WindowReplay::alignment_ce() const { return global_ce_ / global_denominator_; }

bool WindowReplay::deferred(int64_t index) const {
  return index >= 0 && index < static_cast<int64_t>(prepasses_.size()) &&
         !prepasses_[index].ce.defined();
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

namespace {

void check_same_blocks(int64_t index, double replayed, double prepassed) {
  if (replayed != prepassed) {
    fail(
        "DSpine replay of micro-batch {} drew different blocks than its prepass (D {} vs {}); "
        "was a different batch passed?",
        index, replayed, prepassed);
  }
}

}  // namespace

void WindowReplay::finish_replay(int64_t index, const at::Tensor& denominator) {
  if (!reduced_) {
    fail("DSpine replay of micro-batch {} finished before the window's reduction", index);
  }
  auto& prepass = prepasses_[index];
  prepass.replayed = f64(denominator);
  if (!deferred(index) && !prepass.replayed.is_cuda() && !prepass.denominator.is_cuda()) {
    check_same_blocks(index, prepass.replayed.item<double>(), prepass.denominator.item<double>());
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
  // One read: ΣD, then each prepassed micro-batch's prepass and replay D.
  std::vector<at::Tensor> values{global_denominator_};
  for (const auto& p : prepasses_) {
    if (!p.ce.defined()) continue;
    values.push_back(p.denominator.to(global_denominator_.device()));
    values.push_back(p.replayed.to(global_denominator_.device()));
  }
  const auto host = torch::stack(values).cpu();
  const auto v = host.accessor<double, 1>();
  check_supervised(v[0]);
  int64_t read = 1;
  for (size_t i = 0; i < prepasses_.size(); ++i) {
    if (!prepasses_[i].ce.defined()) continue;
    check_same_blocks(static_cast<int64_t>(i), v[read + 1], v[read]);
    read += 2;
  }
  prepasses_.clear();
  replayed_ = 0;
  reduced_ = false;
}

}  // namespace dspine::objectives
