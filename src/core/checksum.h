// File checksums for checkpoints: SHA-256 through OpenSSL's libcrypto, streamed so a file of
// any size is hashed in constant memory.
#pragma once

#include <cstdint>
#include <string>

namespace dspine::core {

struct FileDigest {
  int64_t bytes = 0;
  std::string sha256;  // lowercase hex, 64 characters
};

// Size and SHA-256 of the file at `path`; an unreadable file is an error naming it.
FileDigest digest_file(const std::string& path);

}  // namespace dspine::core
