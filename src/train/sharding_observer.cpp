#include "train/sharding_observer.h"

#include <memory>

#include <torch/nn/module.h>

#include "core/error.h"
#include "model/unit_observer.h"

namespace dspine::train {
namespace {

class ShardingObserver final : public model::UnitObserver {
 public:
  explicit ShardingObserver(dist::ShardedParameters& sharded) : sharded_(sharded) {}
  void before_unit(const std::string& unit) override { sharded_.before_unit(unit); }
  at::Tensor after_unit(const std::string& unit, const at::Tensor& output) override {
    return sharded_.after_unit(unit, output);
  }

 private:
  dist::ShardedParameters& sharded_;
};

}  // namespace

void attach_sharding(torch::nn::Module& module, dist::ShardedParameters& sharded,
                     const std::string& architecture) {
  if (!sharded.gathers_parameters_per_unit()) return;
  auto* observable = dynamic_cast<model::ObservableUnits*>(&module);
  if (observable == nullptr) {
    fail("distributed.sharding = zero3 needs a draft that announces its units; "
         "model.architecture = {} does not",
         architecture);
  }
  observable->set_unit_observer(std::make_shared<ShardingObserver>(sharded));
  sharded.release_all();
}

}  // namespace dspine::train
