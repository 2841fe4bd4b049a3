// One sharding unit (docs/distributed.md): a group of parameters that is gathered, reduced and
// stepped together. Its parameters become views into one flat buffer padded to a multiple of
// the sharding degree; this rank owns slice `rank` of it: the fp32 master weights, the reduced
// gradient the optimizer reads (fp32; in a world of one with the whole state, the model-dtype
// gradient itself), and (zero3) the only resident copy of its model-dtype weights.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dist/communicator.h"
#include "dist/sharding_strategy.h"

namespace dspine::dist {

class ShardedUnit {
 public:
  using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;

  // Re-points every parameter (all on one device, one dtype) into the unit's flat buffer,
  // keeping its values, and gives each a gradient view into a flat gradient buffer.
  ShardedUnit(std::string name, NamedParameters parameters, Communicator& comm,
              ShardingStrategy strategy);

  const std::string& name() const { return name_; }
  const NamedParameters& parameters() const { return parameters_; }
  int64_t numel() const { return numel_; }              // without padding
  int64_t shard_numel() const { return shard_numel_; }  // elements owned by this rank
  int64_t shard_offset() const { return shard_offset_; }

  // [shard_numel]: the optimizer's fp32 weights and (after finish_gradient_reduce) gradient, fp32
  // or, when reduces_gradient() is false, the model's dtype (the parameters' own gradient).
  at::Tensor& master() { return master_; }
  const at::Tensor& gradient() const { return gradient_; }
  // Whether the gradient goes through a collective: the state is sharded or there are ranks.
  bool reduces_gradient() const;
  // State not sharded: the model-dtype weights, laid out as master(), which an optimizer step may
  // write itself instead of publish_master(); undefined when the state is sharded.
  at::Tensor whole_weights() const;

  // Copies the model's current weights into the master (fresh start, after initialisation).
  void load_master_from_model();
  // Starts reducing this unit's accumulated gradient over ranks (SUM, in fp32): a reduce-scatter
  // into this rank's slice when the state is sharded, else an all-reduce. Idempotent until
  // zero_grad.
  void start_gradient_reduce();
  void finish_gradient_reduce();
  bool gradient_reduce_started() const { return reduce_started_; }
  // Starts a new accumulation: every parameter's .grad is undefined until its next gradient.
  void zero_grad();

  // After an optimizer step: the updated masters become the model's weights on every rank
  // (all-gathered, or kept as this rank's shard until the next gather when gathered per unit).
  void publish_master();

  // Gathered per unit (zero3): makes the whole unit resident (all-gather of the shards) / frees it
  // again. Parameters keep their tensors; only the storage behind them comes and goes, so tensors
  // autograd saved during the forward see the weights again when the backward gathers them.
  std::unique_ptr<PendingCollective> start_gather();
  void release();
  bool resident() const;

  // Called by the gradient hook of parameter `index` (of parameters()) once autograd has
  // accumulated its gradient; returns true when that completes the unit (every parameter has its
  // gradient for this backward). The first gradient after zero_grad arrives in a tensor of its
  // own (zero_grad leaves .grad undefined, so autograd hands over the new gradient instead of
  // adding it to zeros); it is copied into the flat gradient, which .grad views again.
  bool note_gradient_accumulated(size_t index);
  void reset_gradient_count() { accumulated_ = 0; }

 private:
  // The flat gradient slice of parameter `index`, shaped as the parameter.
  at::Tensor gradient_view(size_t index) const;
  // Zeroes the slices of parameters that received no gradient since zero_grad (their .grad is
  // still undefined): before anything reads full_gradient_ (the reduce, or the optimizer when
  // nothing is reduced).
  void gradient_ready();

  std::string name_;
  NamedParameters parameters_;
  Communicator& comm_;
  ShardingStrategy strategy_;
  int64_t numel_ = 0, padded_numel_ = 0, shard_numel_ = 0, shard_offset_ = 0;
  int64_t full_bytes_ = 0;
  at::Tensor full_;           // model dtype [padded]: what the parameters view
  at::Tensor full_gradient_;  // model dtype [padded]: what the parameters' .grad view
  at::Tensor shard_weights_;  // gathered per unit: model dtype [shard], this rank's resident slice
  at::Tensor master_;         // fp32 [shard]
  at::Tensor gradient_;       // fp32 [shard] (state not sharded: [padded], all-reduced), or
                              // full_gradient_ when nothing is reduced
  std::vector<int64_t> offsets_;  // each parameter's first element in the flat buffers
  std::unique_ptr<PendingCollective> pending_reduce_;
  bool reduce_started_ = false;
  int64_t accumulated_ = 0;  // parameters whose gradient arrived in this backward
};

}  // namespace dspine::dist
