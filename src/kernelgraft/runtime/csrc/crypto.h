// sha256 (vendored public-domain implementation) and HMAC-SHA256 (RFC 2104), as the bundle's
// checksums and signatures use them; hex digests in lower case, as Python's hexdigest().
#pragma once

#include <string>

namespace kgrt {

std::string sha256_hex(const std::string& data);
std::string hmac_sha256_hex(const std::string& key, const std::string& message);
// Compares two strings in time independent of where they differ (MACs).
bool equal_constant_time(const std::string& a, const std::string& b);

}  // namespace kgrt
