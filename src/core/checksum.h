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

// How an existing file compares with the digest recorded for it: the size first, then (only when
// the size matches) the SHA-256. `found` holds what was measured: the size always, the hash when
// it was computed. Callers word the error for their own manifest.
enum class DigestCheck { kMatches, kSizeDiffers, kHashDiffers };
struct DigestComparison {
  DigestCheck result = DigestCheck::kMatches;
  FileDigest found;
};
DigestComparison compare_file_digest(const std::string& path, const FileDigest& recorded);

}  // namespace dspine::core
