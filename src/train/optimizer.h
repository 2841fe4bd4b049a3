// AdamW over fp32 master weights (as the reference's BF16Optimizer), stepped on the
// slices of the sharding units this rank owns (docs/distributed.md): the units' reduced
// gradients (fp32, or the model's own in a world of one with whole state) are clipped by their
// global norm over all shards, AdamW steps the masters, and they become the model's weights in its
// dtype (published by the sharding, or written by the fused step itself). The step is either
// torch::optim::AdamW's (reference: several ATen kernels per unit) or fused, the clipping folded
// in: on CUDA the project's master AdamW kernel per unit (ATen's fused arithmetic; it reads a
// bf16 gradient directly and writes a whole unit's model weights in the same pass), on the CPU
// one call of ATen's multi-tensor AdamW kernel. Either way the torch::optim::AdamW object owns
// the moments and step counts, so checkpoints interoperate.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/optim/adamw.h>

#include "core/config.h"
#include "core/safetensors.h"
#include "dist/sharded_parameters.h"

namespace dspine::train {

class MasterAdamW {
 public:
  // fused: ATen's fused AdamW kernel (the trainer's choice follows model.fused_kernels).
  MasterAdamW(dist::ShardedParameters& sharded, const core::TrainingConfig& config, bool fused);

  // Finishes the gradient sync and queues this rank's sum of squared gradients on the device,
  // so that whatever the host reads next overlaps it (once the update's last backward is queued).
  void start_gradient_norm();
  // The global L2 norm of the gradients (before clipping), from start_gradient_norm's sum (started
  // here if it was not). Every rank gets the same value, non-finite when any rank's gradient is.
  double gradient_norm();
  // Clips by `norm` (gradient_norm's, finite), applies one AdamW step at `lr`, and publishes
  // the masters into the model.
  void step(double lr, double norm);
  // The first unit whose reduced gradient (this rank's slice of it) is not finite; "" if none.
  std::string first_nonfinite_unit() const;
  void zero_grad();

  // This rank's part of the optimizer state, keyed by unit ("master.<unit>", "exp_avg.<unit>",
  // "exp_avg_sq.<unit>", "step.<unit>") plus "steps". Every mode saves slice `rank` of each
  // unit padded to a multiple of the world size, so any world size and mode can load it.
  core::NamedTensors state() const;
  // Restores state() saved by `saved_world` ranks: `files` holds every rank's file in rank order
  // (any world size and mode: resharded here), or only this rank's own when the world size is
  // unchanged and the mode shards. Errors name the file and the missing or mis-sized tensor.
  void load_state(const std::vector<core::SafetensorsFile>& files, int saved_world);

 private:
  // The fused step of every unit, gradients divided by 1 / clip_coefficient inside it; returns,
  // per unit, whether it also wrote the model's weights (so publish_master is not needed).
  std::vector<bool> fused_step(double lr, double clip_coefficient);
  // The moments of `master` (created on its first step) with the step count incremented.
  torch::optim::AdamWParamState& next_step_state(const torch::Tensor& master);

  dist::ShardedParameters& sharded_;
  std::unique_ptr<torch::optim::AdamW> adamw_;
  double max_grad_norm_;
  bool fused_;
  int64_t steps_ = 0;
  torch::Tensor squared_norm_;  // start_gradient_norm's, until gradient_norm reads it
};

}  // namespace dspine::train
