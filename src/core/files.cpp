#include "core/files.h"

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

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

}  // namespace dspine::core
