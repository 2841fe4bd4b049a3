#include "core/files.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace dspine::core {
namespace {

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  return std::remove(path) == 0 ? 0 : errno;
}

}  // namespace

void remove_tree(const std::string& path) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) return;  // already gone
  const int status = ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  if (status != 0) fail("cannot remove {}: {}", path, std::strerror(status > 0 ? status : errno));
}

void write_file_atomically(const std::string& path,
                           const std::function<void(const std::string& temp)>& write) {
  const std::string temp = path + ".tmp";
  try {
    write(temp);
    // Synced before the rename, so the final name never points at data still in flight.
    const int fd = ::open(temp.c_str(), O_RDONLY);
    if (fd < 0 || ::fsync(fd) != 0) {
      const int error = errno;
      if (fd >= 0) ::close(fd);
      fail("cannot write '{}': {}", temp, std::strerror(error));
    }
    ::close(fd);
    std::filesystem::rename(temp, path);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(temp, ignored);
    throw;
  }
}

}  // namespace dspine::core
