#include "core/log.h"
#include "core/log_stream.h"

#include <unistd.h>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "core/terminal.h"

namespace dspine::log {
namespace {

// spdlog's own test (isatty) colours a launched rank's output, which ends up in pipes and files.
spdlog::logger& logger() {
  static const auto instance = [] {
    auto sink = std::make_shared<spdlog::sinks::stdout_color_sink_mt>(
        core::on_terminal(STDOUT_FILENO) ? spdlog::color_mode::automatic
                                         : spdlog::color_mode::never);
    auto created = std::make_shared<spdlog::logger>("", sink);
    spdlog::set_default_logger(created);
    return created;
  }();
  return *instance;
}

}  // namespace

void send_logs_to_stderr() {
  auto& sinks = logger().sinks();
  sinks.clear();
  sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>(
      core::on_terminal(STDERR_FILENO) ? spdlog::color_mode::automatic
                                       : spdlog::color_mode::never));
}

void set_level(core::LogLevel level) {
  using core::LogLevel;
  switch (level) {
    case LogLevel::kTrace:
      return logger().set_level(spdlog::level::trace);
    case LogLevel::kDebug:
      return logger().set_level(spdlog::level::debug);
    case LogLevel::kInfo:
      return logger().set_level(spdlog::level::info);
    case LogLevel::kWarn:
      return logger().set_level(spdlog::level::warn);
    case LogLevel::kError:
      return logger().set_level(spdlog::level::err);
  }
}
void write_info(const std::string& message) { logger().info("{}", message); }
void write_warn(const std::string& message) { logger().warn("{}", message); }

}  // namespace dspine::log
