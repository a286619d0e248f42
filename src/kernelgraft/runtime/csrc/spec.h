// The bundle spec in C++: the caps and names of bundle_spec.h as constants, and check_manifest,
// which holds a parsed manifest (checksum verified) to the rules kernelgraft/aot/bundle_spec.py
// states, before anything else reads it. The Python loader checks the same rules
// (kernelgraft/aot/bundle_check.py); a corpus of tampered bundles checks that both agree.
// spec_walk.h and spec_schema.cpp hold the pieces of the walk.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "json.h"

namespace kgrt {
namespace spec {

#define KG_LIMIT(name, value) constexpr int64_t name = value;
#include "bundle_spec.h"

// Whether manifest `version` is one the runtime reads (it holds RPN programs).
bool readable_version(int64_t version);
// Those versions, "4" or "4, 5", for a message.
std::string readable_versions();
// The dtype names a bundle may use, in the table's order.
const std::vector<std::string>& dtypes();

// BundleError "<where>: <field path>: <what is wrong>" unless `manifest` is a valid bundle.
void check_manifest(const Json& manifest, const std::string& where);

}  // namespace spec
}  // namespace kgrt
