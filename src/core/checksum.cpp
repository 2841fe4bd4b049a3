#include "core/checksum.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"

namespace dspine::core {
namespace {

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};
struct DigestFree {
  void operator()(EVP_MD_CTX* context) const { EVP_MD_CTX_free(context); }
};

}  // namespace

FileDigest digest_file(const std::string& path) {
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (!file) fail("cannot read {}: {}", path, std::strerror(errno));
  std::unique_ptr<EVP_MD_CTX, DigestFree> context(EVP_MD_CTX_new());
  if (!context || EVP_DigestInit_ex(context.get(), EVP_sha256(), nullptr) != 1) {
    fail("cannot start a SHA-256 digest of {}", path);
  }
  FileDigest digest;
  std::vector<unsigned char> buffer(1 << 20);
  size_t got = 0;
  while ((got = std::fread(buffer.data(), 1, buffer.size(), file.get())) > 0) {
    EVP_DigestUpdate(context.get(), buffer.data(), got);
    digest.bytes += static_cast<int64_t>(got);
  }
  if (std::ferror(file.get())) fail("cannot read {}: {}", path, std::strerror(errno));
  unsigned char hash[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(context.get(), hash, &length);
  for (unsigned int i = 0; i < length; ++i) digest.sha256 += fmt::format("{:02x}", hash[i]);
  return digest;
}

DigestComparison compare_file_digest(const std::string& path, const FileDigest& recorded) {
  DigestComparison out;
  out.found.bytes = static_cast<int64_t>(std::filesystem::file_size(path));
  if (out.found.bytes != recorded.bytes) {
    out.result = DigestCheck::kSizeDiffers;
    return out;
  }
  out.found = digest_file(path);
  if (out.found.sha256 != recorded.sha256) out.result = DigestCheck::kHashDiffers;
  return out;
}

}  // namespace dspine::core
