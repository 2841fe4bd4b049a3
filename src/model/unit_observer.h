// The draft's parameter units (the context projection, each decoder layer, the head: final norm,
// injection and refinement) announced around their use, the way torch module hooks would. The
// model only calls the observer; a wrapper from outside (zero3 sharding, docs/distributed.md)
// uses it to make a unit's weights resident just before it runs and to release them after.
#pragma once

#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

namespace dspine::model {

class UnitObserver {
 public:
  virtual ~UnitObserver() = default;
  // Before the unit's parameters are used.
  virtual void before_unit(const std::string& unit) = 0;
  // After the unit produced `output`, its last use in this forward; returns the tensor the
  // model continues with (the observer may hook the backward there to get the weights back in
  // time). A unit used until the step ends (the head) never gets this call.
  virtual at::Tensor after_unit(const std::string& unit, const at::Tensor& output) = 0;
};

// Implemented by drafts whose units can be observed.
class ObservableUnits {
 public:
  virtual ~ObservableUnits() = default;
  virtual void set_unit_observer(std::shared_ptr<UnitObserver> observer) = 0;
};

}  // namespace dspine::model
