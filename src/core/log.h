// Logging front end. spdlog is compiled only into log.cpp: its fmt (the system's) and the fmt
// bundled with LibTorch's headers differ, so torch translation units format with their own fmt
// and hand finished strings over.
#pragma once

#include <fmt/format.h>

#include <string>
#include <utility>

#include "core/log_level.h"

namespace dspine::log {

// logging.level.
void set_level(core::LogLevel level);
void write_info(const std::string& message);
void write_warn(const std::string& message);

template <typename... Args>
void info(fmt::format_string<Args...> format, Args&&... args) {
  write_info(fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
void warn(fmt::format_string<Args...> format, Args&&... args) {
  write_warn(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace dspine::log
