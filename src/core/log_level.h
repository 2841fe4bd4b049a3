// logging.level's values, apart from the configuration so that the logger (core/log.h) does not
// depend on it: config.cpp logs, and the logger only needs the level.
#pragma once

namespace dspine::core {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError };

}  // namespace dspine::core
