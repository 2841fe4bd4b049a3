#include "data/batch_source.h"

#include "data/source_registry.h"

namespace dspine::data {

std::unique_ptr<BatchSource> make_batch_source(const core::Config& config,
                                               const c10::Device& device) {
  return data_source_entry(config.data.source).make(config, device);
}

std::unique_ptr<BatchSource> make_held_out_source(const core::Config& config,
                                                  BatchSource& training) {
  const auto make = data_source_entry(config.data.source).make_held_out;
  return make != nullptr ? make(config, training) : nullptr;
}

}  // namespace dspine::data
