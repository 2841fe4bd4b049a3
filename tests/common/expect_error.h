// Expecting a dspine::Error whose message names what was wrong.
#pragma once

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"

namespace dspine::testing {

// Runs `body`, expecting a dspine::Error whose message contains every one of `parts`.
template <typename Body>
void expect_error_mentioning(Body body, const std::vector<std::string>& parts) {
  try {
    body();
    ADD_FAILURE() << "expected a dspine::Error mentioning '" << parts.front() << "'";
  } catch (const Error& e) {
    for (const auto& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "'" << e.what() << "' does not mention '" << part << "'";
    }
  }
}

template <typename Body>
void expect_error(Body body, const std::string& needle) {
  expect_error_mentioning(body, {needle});
}

}  // namespace dspine::testing
