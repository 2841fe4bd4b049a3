// A per-process scratch directory under the system temp directory, emptied first.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "core/files.h"

namespace dspine::testing {

inline std::filesystem::path fresh_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("dspine_test_" + name + "_" + std::to_string(::getpid()));
  core::remove_tree(dir.string());
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace dspine::testing
