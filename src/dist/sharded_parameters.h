// FSDP-style parameter sharding applied to a model from outside (docs/distributed.md). The
// model's trainable parameters are grouped into units (the context projection, each decoder
// layer, the rest: final norm, injection and refinement heads); each unit is one ShardedUnit.
//
//   none   every rank keeps every weight, master and moment; gradients are all-reduced one unit
//          (bucket) at a time as soon as the unit's backward is done.
//   zero2  weights stay whole; each unit's gradient is reduce-scattered as soon as its backward
//          is done, and each rank steps only its slice, then the slices are all-gathered.
//   zero3  as zero2, but a unit's weights are resident only while it runs: gathered just before
//          (the next unit prefetched), freed after, gathered again for its backward.
//
// Trainer usage, per optimizer window:
//   zero3: the model announces its units (model/unit_observer.h) → before_unit / after_unit
//   sharded.begin_backward(last_micro_batch);  before each backward
//   sharded.finish_gradient_sync();  after the window's backward: every unit's reduced gradient
//   optimizer step on master()/gradient() of every unit; publish_master() of each unit whose
//   weights the step did not write itself (ShardedUnit::whole_weights);
//   sharded.zero_grad();  (zero3: releases every unit until the next forward needs it)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "dist/sharded_unit.h"

namespace torch::nn {
class Module;
}

namespace dspine::dist {

// Units in the order the forward first uses them: "context" (fc., hidden_norm.), "layers.<i>"
// for every layers.<i>. prefix, then "head" for everything else. Frozen parameters
// (requires_grad false) are not in any unit: they stay replicated as they are.
std::vector<std::pair<std::string, ShardedUnit::NamedParameters>> plan_units(
    torch::nn::Module& module);

class ShardedParameters {
 public:
  // prefetch (zero3): gather the next unit while the current one runs.
  ShardedParameters(torch::nn::Module& module, std::shared_ptr<Communicator> comm,
                    core::Sharding mode, bool prefetch = true);
  ~ShardedParameters();
  ShardedParameters(const ShardedParameters&) = delete;
  ShardedParameters& operator=(const ShardedParameters&) = delete;

  // What distributed.sharding does, asked instead of the mode (dist/sharding_strategy.h).
  bool shards_state() const { return strategy_.shards_state; }
  bool gathers_parameters_per_unit() const { return strategy_.gathers_parameters_per_unit; }
  Communicator& comm() { return *comm_; }
  std::vector<ShardedUnit>& units() { return units_; }

  // When `sync` is true, the backward that follows starts each unit's gradient reduce as soon
  // as all of the unit's gradients are accumulated (the last micro-batch of a window);
  // otherwise gradients only accumulate locally.
  void begin_backward(bool sync);
  // Reduces whatever the backward did not start (units without gradients, no hooks fired) and
  // waits for every reduce.
  void finish_gradient_sync();

  // Sum of a per-rank partial over the ranks that hold different slices (a gradient norm²):
  // the identity when the state is not sharded, where every rank holds everything.
  double sum_over_shards(double local);

  void load_masters_from_model();
  void publish_masters();
  void zero_grad();

  // Gathered per unit (zero3): every unit resident (checkpoints, evaluation) / every unit
  // released again.
  void gather_all();
  void release_all();

  // zero3, called as the model announces its units: before_unit makes the unit resident
  // (waiting for its prefetch) and prefetches the next one; after_unit releases it and hooks
  // `output` so that the backward gathers it again (and prefetches the unit before it) just
  // before the unit's own backward runs. No-ops unless parameters are gathered per unit.
  void before_unit(const std::string& name);
  at::Tensor after_unit(const std::string& name, const at::Tensor& output);

  // Called from the parameters' post-accumulate-grad hooks.
  void on_gradient_accumulated(size_t unit, size_t parameter);

 private:
  size_t index_of(const std::string& name) const;
  void make_resident(size_t unit);
  void prefetch(size_t unit);

  std::shared_ptr<Communicator> comm_;
  ShardingStrategy strategy_;
  bool prefetch_;
  std::vector<ShardedUnit> units_;
  std::vector<std::unique_ptr<PendingCollective>> pending_gathers_;  // zero3 prefetches
  std::vector<bool> released_in_forward_;  // zero3: release again once its backward is done
  std::vector<at::Tensor> hooked_;  // parameters carrying our gradient hook
  bool sync_ = true;
};

}  // namespace dspine::dist
