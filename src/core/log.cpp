#include "core/log.h"

#include <spdlog/spdlog.h>

namespace dspine::log {

void set_level(const std::string& level) { spdlog::set_level(spdlog::level::from_str(level)); }
void write_info(const std::string& message) { spdlog::info("{}", message); }
void write_warn(const std::string& message) { spdlog::warn("{}", message); }

}  // namespace dspine::log
