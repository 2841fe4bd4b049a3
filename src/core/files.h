// File-system helpers the standard library can't be trusted with here: libtorch.so exports its
// own copy of std::filesystem::remove_all, which crashes when the dynamic linker binds our calls
// to it, so recursive removal goes through POSIX nftw instead.
#pragma once

#include <string>

namespace dspine::core {

// Removes `path` and everything below it; a missing path is not an error.
void remove_tree(const std::string& path);

}  // namespace dspine::core
