#include "crypto.h"

#include "third_party/sha256.h"

namespace kgrt {
namespace {

std::string digest(const std::string& data) {
  SHA256_CTX ctx;
  BYTE out[SHA256_BLOCK_SIZE];
  sha256_init(&ctx);
  sha256_update(&ctx, reinterpret_cast<const BYTE*>(data.data()), data.size());
  sha256_final(&ctx, out);
  return std::string(reinterpret_cast<char*>(out), SHA256_BLOCK_SIZE);
}

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

}  // namespace

std::string sha256_hex(const std::string& data) { return hex(digest(data)); }

std::string hmac_sha256_hex(const std::string& key, const std::string& message) {
  const size_t block = 64;
  std::string k = key.size() > block ? digest(key) : key;
  k.resize(block, '\0');
  std::string inner(block, '\0'), outer(block, '\0');
  for (size_t i = 0; i < block; ++i) {
    inner[i] = static_cast<char>(k[i] ^ 0x36);
    outer[i] = static_cast<char>(k[i] ^ 0x5c);
  }
  return hex(digest(outer + digest(inner + message)));
}

bool equal_constant_time(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace kgrt
