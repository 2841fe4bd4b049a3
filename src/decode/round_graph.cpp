#include "decode/round_graph.h"

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAStream.h>

#include <exception>
#include <optional>

#include "core/error.h"

namespace dspine::decode {

struct RoundGraph::Cuda {
  Cuda(c10::DeviceIndex device, at::Generator generator)
      : stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device)),
        side(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device)),
        generator(std::move(generator)) {}

  // A fresh graph, the generator registered with it.
  void renew() {
    graph = std::make_unique<at::cuda::CUDAGraph>();
    if (generator.defined()) graph->register_generator_state(generator);
  }

  c10::cuda::CUDAStream stream;
  c10::cuda::CUDAStream side;                   // beside()'s second branch
  std::optional<c10::cuda::CUDAStream> caller;  // while on the graph's stream
  at::Generator generator;
  std::unique_ptr<at::cuda::CUDAGraph> graph;
};

RoundGraph::RoundGraph(const c10::Device& device, bool capture, const at::Generator& generator) {
  if (!capture || !device.is_cuda()) return;
  cuda_ = std::make_unique<Cuda>(device.index(), generator);
  cuda_->renew();
}

RoundGraph::~RoundGraph() = default;

RoundGraph::OnItsStream::OnItsStream(RoundGraph& graph) : graph_(graph) {
  auto* cuda = graph_.cuda_.get();
  if (cuda == nullptr) return;
  cuda->caller = c10::cuda::getCurrentCUDAStream(cuda->stream.device_index());
  at::cuda::CUDAEvent ready;
  ready.record(*cuda->caller);
  ready.block(cuda->stream);
  c10::cuda::setCurrentCUDAStream(cuda->stream);
}

RoundGraph::OnItsStream::~OnItsStream() {
  auto* cuda = graph_.cuda_.get();
  if (cuda == nullptr || !cuda->caller) return;
  at::cuda::CUDAEvent done;
  done.record(cuda->stream);
  done.block(*cuda->caller);
  c10::cuda::setCurrentCUDAStream(*cuda->caller);
  cuda->caller.reset();
}

void RoundGraph::run(const std::function<void()>& round) {
  const int64_t run = runs_++;
  if (cuda_ == nullptr || run == 0) {
    round();
    return;
  }
  if (run == 1) {
    // Thread-local: another thread's CUDA calls (a communicator's, a loader's) must not break it.
    cuda_->graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    try {
      round();
    } catch (const std::exception& error) {
      // Leave capture mode (and the graph's memory pool) before reporting; ending a broken
      // capture throws too, and that says nothing more.
      try {
        cuda_->graph->capture_end();
      } catch (const std::exception&) {
      }
      forget();
      fail(
          "decoding: a round cannot be captured as a CUDA graph (--no-cuda-graphs runs it "
          "eagerly): {}",
          error.what());
    }
    cuda_->graph->capture_end();
  }
  cuda_->graph->replay();
}

void RoundGraph::beside(const std::function<void()>& work, const std::function<void()>& meanwhile) {
  if (cuda_ == nullptr) {
    work();
    meanwhile();
    return;
  }
  const auto round = c10::cuda::getCurrentCUDAStream(cuda_->side.device_index());
  at::cuda::CUDAEvent forked, joined;
  forked.record(round);
  forked.block(cuda_->side);
  c10::cuda::setCurrentCUDAStream(cuda_->side);
  try {
    work();
  } catch (...) {
    c10::cuda::setCurrentCUDAStream(round);
    throw;
  }
  joined.record(cuda_->side);
  c10::cuda::setCurrentCUDAStream(round);
  meanwhile();
  joined.block(round);
}

void RoundGraph::forget() {
  runs_ = 0;
  if (cuda_ != nullptr) cuda_->renew();
}

}  // namespace dspine::decode
