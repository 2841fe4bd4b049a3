// Chunked objective evaluation (docs/model.md, "Chunking"): aligned tensors are split along dim 0
// into consecutive chunks, fn runs on each, and the returned scalars are summed element-wise. With
// a positive chunk size and autograd on, every chunk is activation-checkpointed: its forward runs
// without a graph (only the chunk inputs are kept) and its backward recomputes the chunk with grad,
// so the [c, T, V] logits of at most one chunk are alive at a time.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace dspine::objectives {

// Must be deterministic (it is re-run in backward) and return scalars.
using ChunkFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// chunk_size = 0: one call on everything, no checkpointing. `parameters` are the trainable
// tensors fn uses besides its inputs (they receive their gradients through the checkpoint).
// Throws on empty/misaligned inputs, a negative chunk size, or fn returning a differing count.
std::vector<at::Tensor> checkpointed_chunk_reduce(const ChunkFn& fn,
                                                  const std::vector<at::Tensor>& tensors,
                                                  int64_t chunk_size,
                                                  const std::vector<at::Tensor>& parameters);

// Name of the autograd node a checkpointed chunk leaves in the graph (tests look for it).
extern const char* const kChunkCheckpointNodeName;

}  // namespace dspine::objectives
