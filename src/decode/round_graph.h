// A decoding round as a CUDA graph (docs/decoding.md, "CUDA graphs"). A round of a small draft and
// target is hundreds of small kernels, and launching them one by one from the host costs more than
// running them: the device sat idle 95% of a batch-1 round. The round's device work has fixed
// shapes and reads nothing back, so it is captured once and replayed as one launch per round.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>

namespace dspine::decode {

class RoundGraph {
 public:
  // Captures on a CUDA `device` with `capture` on, registering `generator` (may be undefined) so
  // that its draws advance at every replay; elsewhere every round runs eagerly.
  RoundGraph(const c10::Device& device, bool capture, const at::Generator& generator);
  ~RoundGraph();
  RoundGraph(const RoundGraph&) = delete;
  RoundGraph& operator=(const RoundGraph&) = delete;

  bool captures() const { return cuda_ != nullptr; }

  // While one lives, the device work runs on the graph's own stream (a graph cannot be captured on
  // the default stream), after the caller's stream's work; the caller's stream waits for it again
  // at the end.
  class OnItsStream {
   public:
    explicit OnItsStream(RoundGraph& graph);
    ~OnItsStream();
    OnItsStream(const OnItsStream&) = delete;
    OnItsStream& operator=(const OnItsStream&) = delete;

   private:
    RoundGraph& graph_;
  };

  // Runs one round's device work. Captured, the first run is eager (it warms up what a capture
  // cannot do: lazy initialisations, cuBLAS's workspace, the kernels' first-shape choices), the
  // second is captured and replayed, and later runs replay it: `round` must do the same work
  // every time, on tensors it updates in place and whose addresses do not change.
  void run(const std::function<void()>& round);

  // Inside a round: `work` and `meanwhile`, which need each other's results only after both, run
  // side by side on CUDA (`work` on a second stream forked from the round's and joined back, two
  // branches of the captured graph), one after the other elsewhere.
  void beside(const std::function<void()>& work, const std::function<void()>& meanwhile);

  // Drops the captured round (its tensors moved): the next run starts over with an eager one.
  void forget();

 private:
  struct Cuda;
  std::unique_ptr<Cuda> cuda_;
  int64_t runs_ = 0;
};

}  // namespace dspine::decode
