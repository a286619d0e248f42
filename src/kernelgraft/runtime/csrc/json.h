// JSON for the runtime: picojson (vendored) for parsing, plus the canonical form Python's
// json.dumps(value, sort_keys=True, separators=(",", ":")) writes, byte for byte, because the
// manifest checksum and the bundle signature are sha256 / HMAC over that form.
#pragma once

#define PICOJSON_USE_INT64
#include "third_party/picojson.h"

#include <stdexcept>
#include <string>

namespace kgrt {

// A bundle that cannot be used: the message names the bundle, the file and what is wrong.
struct BundleError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using Json = picojson::value;

// Parses `text` under the bundle spec's JSON rules (kernelgraft/aot/bundle_spec.py): UTF-8, the
// RFC 8259 grammar with integers within int64 and finite numbers, no key twice in an object, no
// trailing data, nesting at most spec::JSON_DEPTH (checked before parsing, which recurses per
// level); BundleError naming `where` otherwise.
Json parse_json(const std::string& text, const std::string& where);

// Python's canonical JSON of `value` (ensure_ascii, float repr, sorted keys, no spaces).
std::string canonical_json(const Json& value);

// Typed access with BundleErrors naming the field (`where` says which object it is in).
const Json& field(const Json& object, const char* key, const std::string& where);
const std::string& as_string(const Json& v, const std::string& where);
int64_t as_int(const Json& v, const std::string& where);
const picojson::array& as_array(const Json& v, const std::string& where);
const picojson::object& as_object(const Json& v, const std::string& where);

}  // namespace kgrt
