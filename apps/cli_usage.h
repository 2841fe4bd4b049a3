// The tools' answer to a usage error (a CLI11 ParseError: an unknown flag, a missing argument or
// subcommand, a value out of range): CLI11 prints the error and "Run with --help for more
// information." (or the help itself for --help), and the tool exits 2, the shell's status for a
// usage error, rather than CLI11's own codes (106 for a missing subcommand, 109 for an extra
// argument, ...), which a script cannot tell from the tools' other failures.
#pragma once

#include <CLI/CLI.hpp>

namespace dspine::cli {

inline constexpr int kUsageError = 2;

// What main returns for `error`: 0 for --help, kUsageError for every usage error.
inline int exit_on_usage_error(const CLI::App& app, const CLI::ParseError& error) {
  const int code = app.exit(error);
  return code == static_cast<int>(CLI::ExitCodes::Success) ? code : kUsageError;
}

}  // namespace dspine::cli
