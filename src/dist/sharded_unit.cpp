#include "dist/sharded_unit.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>

#include "core/error.h"

namespace dspine::dist {

ShardedUnit::ShardedUnit(std::string name, NamedParameters parameters, Communicator& comm,
                         ShardingStrategy strategy)
    : name_(std::move(name)), parameters_(std::move(parameters)), comm_(comm), strategy_(strategy) {
  if (parameters_.empty()) fail("sharding unit {} has no parameters", name_);
  const auto options = parameters_.front().second.options();
  for (const auto& [key, parameter] : parameters_) {
    if (parameter.scalar_type() != options.dtype().toScalarType() ||
        parameter.device() != options.device()) {
      fail("sharding unit {}: parameter {} is {} on {}, the unit's first is {} on {}", name_, key,
           c10::toString(parameter.scalar_type()), parameter.device().str(),
           c10::toString(options.dtype().toScalarType()), options.device().str());
    }
    numel_ += parameter.numel();
  }
  // Sharded state: rank r owns slice r; otherwise every rank owns the whole unit.
  const int64_t degree = strategy_.shards_state ? comm_.world_size() : 1;
  const int64_t rank = strategy_.shards_state ? comm_.rank() : 0;
  padded_numel_ = (numel_ + degree - 1) / degree * degree;
  shard_numel_ = padded_numel_ / degree;
  shard_offset_ = rank * shard_numel_;
  full_bytes_ = padded_numel_ * static_cast<int64_t>(options.dtype().itemsize());

  c10::NoGradGuard no_grad;
  full_ = at::zeros({padded_numel_}, options);
  full_gradient_ = at::zeros({padded_numel_}, options);
  int64_t offset = 0;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    auto& parameter = parameters_[i].second;
    const int64_t n = parameter.numel();
    auto weights = full_.narrow(0, offset, n).view(parameter.sizes());
    weights.copy_(parameter);
    parameter.set_data(weights);
    offsets_.push_back(offset);
    parameter.mutable_grad() = gradient_view(i);
    offset += n;
  }
  master_ = at::empty({shard_numel_}, options.dtype(at::kFloat));
  // A world of one with the whole state has nothing to reduce: the optimizer reads the model-dtype
  // gradient itself (widening it is exact), instead of an fp32 copy of it.
  gradient_ = reduces_gradient()
                  ? at::zeros({strategy_.shards_state ? shard_numel_ : padded_numel_},
                              options.dtype(at::kFloat))
                  : full_gradient_;
  load_master_from_model();
}

void ShardedUnit::load_master_from_model() {
  c10::NoGradGuard no_grad;
  if (strategy_.gathers_parameters_per_unit && !resident()) {
    master_.copy_(shard_weights_);
    return;
  }
  const auto owned = full_.narrow(0, shard_offset_, shard_numel_);
  master_.copy_(owned);
  if (strategy_.gathers_parameters_per_unit) shard_weights_ = owned.clone();
}

at::Tensor ShardedUnit::gradient_view(size_t index) const {
  const auto& parameter = parameters_[index].second;
  return full_gradient_.narrow(0, offsets_[index], parameter.numel()).view(parameter.sizes());
}

bool ShardedUnit::note_gradient_accumulated(size_t index) {
  const auto& parameter = parameters_[index].second;
  if (!parameter.grad().is_alias_of(full_gradient_)) {
    c10::NoGradGuard no_grad;
    auto view = gradient_view(index);
    view.copy_(parameter.grad());
    parameter.mutable_grad() = view;
  }
  return ++accumulated_ == static_cast<int64_t>(parameters_.size());
}

void ShardedUnit::gradient_ready() {
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    auto& parameter = parameters_[i].second;
    if (parameter.grad().defined()) continue;
    auto view = gradient_view(i);
    view.zero_();
    parameter.mutable_grad() = view;
  }
}

void ShardedUnit::start_gradient_reduce() {
  if (reduce_started_) return;
  reduce_started_ = true;
  gradient_ready();
  if (!reduces_gradient()) return;
  c10::NoGradGuard no_grad;
  if (!strategy_.shards_state) {
    gradient_.copy_(full_gradient_);
    pending_reduce_ = comm_.all_reduce_async(gradient_, ReduceOp::kSum);
    return;
  }
  // The communicator keeps the fp32 copy alive until the collective is done (MPI holds it, NCCL
  // records it on its stream), so each unit's copy is freed as soon as its reduce finishes.
  pending_reduce_ =
      comm_.reduce_scatter_async(full_gradient_.to(at::kFloat), gradient_, ReduceOp::kSum);
}

void ShardedUnit::finish_gradient_reduce() {
  start_gradient_reduce();
  if (pending_reduce_) pending_reduce_->wait();
  pending_reduce_.reset();
}

void ShardedUnit::zero_grad() {
  if (pending_reduce_) fail("sharding unit {}: zero_grad while its gradient reduce runs", name_);
  // No fill: the next backward's first gradient of each parameter is copied over its slice.
  for (auto& [key, parameter] : parameters_) parameter.mutable_grad() = at::Tensor();
  reduce_started_ = false;
}

void ShardedUnit::publish_master() {
  c10::NoGradGuard no_grad;
  if (!strategy_.shards_state) {
    full_.copy_(master_);
    return;
  }
  if (strategy_.gathers_parameters_per_unit) {
    shard_weights_.copy_(master_);
    if (resident()) start_gather()->wait();
    return;
  }
  auto shard = master_.to(full_.scalar_type());
  comm_.all_gather(shard, full_);
}

bool ShardedUnit::reduces_gradient() const {
  return strategy_.shards_state || comm_.world_size() > 1;
}

at::Tensor ShardedUnit::whole_weights() const {
  return strategy_.shards_state ? at::Tensor() : full_;
}

bool ShardedUnit::resident() const {
  return full_.storage().nbytes() == static_cast<size_t>(full_bytes_);
}

std::unique_ptr<PendingCollective> ShardedUnit::start_gather() {
  if (!strategy_.gathers_parameters_per_unit) {
    fail("sharding unit {}: gather needs zero3", name_);
  }
  auto* storage = full_.storage().unsafeGetStorageImpl();
  if (!resident()) {
    storage->set_data_ptr_noswap(storage->allocator()->allocate(full_bytes_));
    storage->set_nbytes(full_bytes_);
  }
  return comm_.all_gather_async(shard_weights_, full_);
}

void ShardedUnit::release() {
  if (!strategy_.gathers_parameters_per_unit) return;
  full_.storage().unsafeGetStorageImpl()->reset();
}

}  // namespace dspine::dist
