// Whether output may carry terminal escape codes (colours, redrawing one line).
#pragma once

#include <unistd.h>

#include <cstdlib>

namespace dspine::core {

// True when `fd` is a terminal. Under mpirun a rank's stdout is a pseudo-terminal that mpirun
// forwards wherever its own output goes (a pipe, a file), so a launched rank never counts.
inline bool on_terminal(int fd) {
  const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
                        std::getenv("PMI_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
  return !launched && ::isatty(fd) != 0;
}

}  // namespace dspine::core
