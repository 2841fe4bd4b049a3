// Tests that loop over a configuration choice by its YAML spelling (a directory name, a message)
// turn the spelling into the enum through the same table parse_config reads (core/config.h).
#pragma once

#include <stdexcept>
#include <string>

#include "core/config.h"

namespace dspine::testing {

template <typename E>
E choice_named(const std::string& name) {
  for (const auto& choice : core::choices_of(E{})) {
    if (name == choice.name) return choice.value;
  }
  throw std::invalid_argument("no choice is spelled " + name);
}

}  // namespace dspine::testing
