// The pieces of the C++ bundle spec check (spec.cpp walks a manifest with them): the rows of
// bundle_spec.h as tables, small predicates, and Walk, which reads typed fields (failing with the
// field's path), counts expression text and program tokens against the caps, and checks programs.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "program.h"
#include "spec.h"

namespace kgrt {
namespace spec {
namespace detail {

struct Kind {
  std::string schema_type;
  bool tensor;
};
const std::map<std::string, Kind>& param_kinds();
enum { kNamespaces, kReservedParams, kKernelKinds, kImageKinds, kDtypes };
const std::set<std::string>& set_of(int which);
const std::map<std::string, std::string>& triton_types();  // dtype -> Triton's pointee type
const std::map<std::string, std::string>& c_types();       // CUDA C++ type -> dtype
const std::string& str_default_chars();

constexpr int64_t kMaxBlock[3] = {1024, 1024, 64};
constexpr int64_t kMaxThreads = 1024;
constexpr int64_t kMaxGrid[3] = {2147483647LL, 65535, 65535};
constexpr int64_t kMaxShared = 228 * 1024;

size_t chars(const std::string& s);  // Python's len(): code points
bool identifier(const std::string& s);
bool digits(const std::string& s, size_t from);
bool arch_name(const std::string& a);
bool sha256_hex(const std::string& s);
bool bin_file(const std::string& s);
std::string kind_of(const Json& v);
std::string quoted(const std::string& s);

class Walk {
 public:
  Walk(const std::string& where, int64_t version) : where_(where), version_(version) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw BundleError(where_ + ": " + path + ": " + what);
  }

  const picojson::object& obj(const Json& v, const std::string& path) const {
    if (!v.is<picojson::object>()) fail(path, "is " + kind_of(v) + ", not an object");
    return v.get<picojson::object>();
  }
  const Json& field(const picojson::object& o, const std::string& key, const std::string& path) const {
    auto it = o.find(key);
    if (it == o.end()) fail(path, "lacks '" + key + "'");
    return it->second;
  }
  const picojson::array& lst(const Json& v, const std::string& path, int64_t cap = -1, const char* cap_name = "",
                             int64_t exact = -1) const {
    if (!v.is<picojson::array>()) fail(path, "is " + kind_of(v) + ", not a list");
    const auto& a = v.get<picojson::array>();
    int64_t n = static_cast<int64_t>(a.size());
    if (exact >= 0 && n != exact) fail(path, "has " + std::to_string(n) + " items, not " + std::to_string(exact));
    if (cap >= 0 && n > cap)
      fail(path, "has " + std::to_string(n) + " items, over the cap of " + std::to_string(cap) + " (" + cap_name + ")");
    return a;
  }
  const std::string& string(const Json& v, const std::string& path, int64_t cap = TEXT_CHARS,
                            const char* cap_name = "TEXT_CHARS") const {
    if (!v.is<std::string>()) fail(path, "is " + kind_of(v) + ", not a string");
    const std::string& s = v.get<std::string>();
    size_t n = chars(s);
    if (static_cast<int64_t>(n) > cap)
      fail(path, "is " + std::to_string(n) + " characters, over the cap of " + std::to_string(cap) + " (" + cap_name + ")");
    return s;
  }
  int64_t integer(const Json& v, const std::string& path, int64_t lo, int64_t hi) const {
    if (!v.is<int64_t>()) fail(path, "is " + kind_of(v) + ", not an integer");
    int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) fail(path, "is " + std::to_string(x) + ", outside " + std::to_string(lo) + ".." + std::to_string(hi));
    return x;
  }
  bool boolean(const Json& v, const std::string& path) const {
    if (!v.is<bool>()) fail(path, "is " + kind_of(v) + ", not a bool");
    return v.get<bool>();
  }
  const std::string& one_of(const Json& v, const std::string& path, const std::set<std::string>& allowed) const {
    if (!v.is<std::string>() || !allowed.count(v.get<std::string>())) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      fail(path, (v.is<std::string>() ? quoted(v.get<std::string>()) : kind_of(v)) + " is not one of [" + list + "]");
    }
    return v.get<std::string>();
  }
  void scalar(const Json& v, const std::string& path) const {
    if (v.is<std::string>()) string(v, path);
    else if (!(v.is<picojson::null>() || v.is<bool>() || v.is<double>()))
      fail(path, "is " + kind_of(v) + ", not a null, bool, number or string");
  }
  const std::string& expr(const Json& v, const std::string& path) {
    const std::string& text = string(v, path, EXPR_CHARS, "EXPR_CHARS");
    if (texts_.insert(text).second) {
      expr_chars_ += static_cast<int64_t>(chars(text));
      if (expr_chars_ > EXPR_DISTINCT_CHARS)
        fail(path, "the distinct expressions pass the cap of " + std::to_string(EXPR_DISTINCT_CHARS) +
                       " characters (EXPR_DISTINCT_CHARS)");
    }
    return text;
  }

  // One RPN program over `n_inputs` inputs; returns whether it is constant (its value in *value).
  bool program(const Json& v, const std::string& path, size_t n_inputs, Value* value = nullptr);
  // The value of tokens[begin, end), a constant subprogram; fails when it is an error.
  Value evaluate(const picojson::array& tokens, size_t begin, size_t end, const std::string& path) const;

  int64_t version() const { return version_; }

 private:
  std::string where_;
  int64_t version_;
  std::set<std::string> texts_;
  int64_t expr_chars_ = 0;
  int64_t tokens_ = 0;
};

using Kinds = std::map<std::string, std::string>;  // param name -> kind

// spec_schema.cpp: an op parameter, and the schema against the parameters.
void check_param(const Walk& w, const picojson::object& p, const std::string& path);
void check_schema(const Walk& w, const Json& schema, const picojson::array& params, const std::string& returns,
                  int64_t n_returns, const std::string& path);

}  // namespace detail
}  // namespace spec
}  // namespace kgrt
