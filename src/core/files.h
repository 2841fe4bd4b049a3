// File-system helpers the standard library can't be trusted with here: libtorch.so exports its
// own copy of std::filesystem::remove_all, which crashes when the dynamic linker binds our calls
// to it, so recursive removal goes through POSIX nftw instead.
#pragma once

#include <functional>
#include <string>

namespace dspine::core {

// Removes `path` and everything below it; a missing path is not an error.
void remove_tree(const std::string& path);

// Writes the file at `path` all or nothing: `write` fills the temporary file it is given
// (`path`.tmp, in the same directory so that the rename stays on one file system), which is
// then synced to disk and renamed over `path`. `path` therefore holds its old contents or the
// complete new ones, never part of them. On an error the temporary is removed and the error
// propagates.
void write_file_atomically(const std::string& path,
                           const std::function<void(const std::string& temp)>& write);

}  // namespace dspine::core
