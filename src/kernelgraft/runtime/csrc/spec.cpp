// check_manifest: the rules of kernelgraft/aot/_bundle_spec.py, walked in the same order and
// naming fields by the same paths as kernelgraft/aot/_bundle_check.py. Every count is capped
// before a loop runs over it; constant program parts are evaluated with the runtime's own
// evaluator (program.h). What only the Python loader checks: that each expression text compiles
// to its program (the runtime never reads the texts).
#include "spec.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <set>

#include "program.h"

namespace kgrt {
namespace spec {
namespace {

struct Kind {
  std::string schema_type;
  bool tensor;
};

const std::map<std::string, Kind>& param_kinds() {
  static const std::map<std::string, Kind> table = {
#define KG_PARAM_KIND(kind, schema_type, tensor) {kind, {schema_type, tensor != 0}},
#include "bundle_spec.h"
  };
  return table;
}

const std::set<std::string>& set_of(int which) {
  static const std::set<std::string> namespaces = {
#define KG_RESERVED_NAMESPACE(name) name,
#include "bundle_spec.h"
  };
  static const std::set<std::string> params = {
#define KG_RESERVED_PARAM(name) name,
#include "bundle_spec.h"
  };
  static const std::set<std::string> kernel_kinds = {
#define KG_KERNEL_PARAM_KIND(kind) kind,
#include "bundle_spec.h"
  };
  static const std::set<std::string> image_kinds = {
#define KG_IMAGE_KIND(kind) kind,
#include "bundle_spec.h"
  };
  static const std::set<std::string> dtype_set(dtypes().begin(), dtypes().end());
  const std::set<std::string>* all[] = {&namespaces, &params, &kernel_kinds, &image_kinds, &dtype_set};
  return *all[which];
}
enum { kNamespaces, kReservedParams, kKernelKinds, kImageKinds, kDtypes };

const std::map<std::string, std::string>& triton_types() {
  static const std::map<std::string, std::string> table = {
#define KG_TRITON_TYPE(dtype, triton) {dtype, triton},
#include "bundle_spec.h"
  };
  return table;
}

const std::map<std::string, std::string>& c_types() {
  static const std::map<std::string, std::string> table = {
#define KG_C_TYPE(c_type, dtype) {c_type, dtype},
#include "bundle_spec.h"
  };
  return table;
}

const std::string& str_default_chars() {
  static const std::string chars =
#define KG_STR_DEFAULT_CHARS(chars) chars
#include "bundle_spec.h"
      ;
  return chars;
}

constexpr int64_t kMaxBlock[3] = {1024, 1024, 64};
constexpr int64_t kMaxThreads = 1024;
constexpr int64_t kMaxGrid[3] = {2147483647LL, 65535, 65535};
constexpr int64_t kMaxShared = 228 * 1024;

// Python's len() of a UTF-8 string: its code points.
size_t chars(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool identifier(const std::string& s) {
  if (s.empty() || !(isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (unsigned char c : s)
    if (!(isalnum(c) || c == '_') || c >= 0x80) return false;
  return true;
}

bool digits(const std::string& s, size_t from) {
  return from < s.size() && s.find_first_not_of("0123456789", from) == std::string::npos;
}

bool arch_name(const std::string& a) {
  if (a.rfind("sm_", 0) != 0) return false;
  std::string d = a.substr(3);
  if (!d.empty() && d.back() == 'a') d.pop_back();
  return d.size() >= 2 && d.size() <= 3 && digits(d, 0);
}

bool sha256_hex(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

bool bin_file(const std::string& s) {
  static const std::string tail = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-";
  return s.size() > 4 && s.rfind("bin/", 0) == 0 && s[4] != '.' && s.find_first_not_of(tail, 4) == std::string::npos;
}

std::string kind_of(const Json& v) {
  if (v.is<picojson::null>()) return "null";
  if (v.is<bool>()) return "a bool";
  if (v.is<int64_t>()) return "an int";
  if (v.is<double>()) return "a float";
  if (v.is<std::string>()) return "a string";
  if (v.is<picojson::array>()) return "a list";
  return "an object";
}

std::string quoted(const std::string& s) { return "'" + s.substr(0, 80) + "'"; }

// A schema parameter: TYPE[(aN!)][[]][?] NAME[=DEFAULT].
struct SchemaParam {
  std::string type, name, default_text;
  int64_t alias = -1;
  bool is_list = false, optional = false, has_default = false;
};

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

  // One RPN program; returns whether it is constant (and its value in *value).
  bool program(const Json& v, const std::string& path, size_t n_inputs, Value* value = nullptr) {
    const auto& tokens = lst(v, path, PROGRAM_TOKENS, "PROGRAM_TOKENS");
    tokens_ += static_cast<int64_t>(tokens.size());
    if (tokens_ > PROGRAM_TOKENS_TOTAL)
      fail(path, "the programs pass the cap of " + std::to_string(PROGRAM_TOKENS_TOTAL) + " tokens (PROGRAM_TOKENS_TOTAL)");
    static const std::set<std::string> binary = {"+", "-", "*", "//", "%", "**", "|", "&", "<<", ">>", "/",
                                                 "==", "!=", "<", "<=", ">", ">="};
    static const std::set<std::string> unary = {"neg", "pos", "not"}, logic = {"and", "or"},
                                       calls = {"min", "max", "next_pow2"};
    static const std::map<std::string, size_t> arity = {{"int", 2}, {"float", 2}, {"size", 3}, {"arg", 2},
                                                        {"op", 2}, {"unary", 2}, {"bool", 3}, {"call", 3}};
    std::vector<std::pair<size_t, bool>> stack;  // (first token, constant) of each value
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string at = path + "[" + std::to_string(i) + "]";
      const Json& tv = tokens[i];
      if (!tv.is<picojson::array>() || tv.get<picojson::array>().empty() || !tv.get<picojson::array>()[0].is<std::string>())
        fail(at, "is not a token [TAG, ...]");
      const auto& t = tv.get<picojson::array>();
      const std::string& tag = t[0].get<std::string>();
      auto found = arity.find(tag);
      if (found == arity.end()) fail(at, quoted(tag) + " is not one of int/float/size/arg/op/unary/bool/call");
      if (t.size() != found->second)
        fail(at, "'" + tag + "' has " + std::to_string(t.size() - 1) + " operands, not " + std::to_string(found->second - 1));
      size_t pops = 0;
      bool constant = true;
      if (tag == "int") {
        bool ok = t[1].is<std::string>() && t[1].get<std::string>().size() <= 41;
        if (ok) {
          const std::string& text = t[1].get<std::string>();
          ok = digits(text, text.rfind('-', 0) == 0 ? 1 : 0);
          if (ok) {
            try {
              Program(picojson::value(picojson::array{tv}), 0, at);  // its 128-bit range check
            } catch (const BundleError&) {
              ok = false;
            }
          }
        }
        if (!ok) fail(at, "is not [\"int\", DECIMAL] of a 128-bit integer");
      } else if (tag == "float") {
        if (!t[1].is<double>()) fail(at, "is not [\"float\", NUMBER]");
      } else if (tag == "size" || tag == "arg") {
        if (!t[1].is<int64_t>() || t[1].get<int64_t>() < 0 || t[1].get<int64_t>() >= static_cast<int64_t>(n_inputs))
          fail(at, "input " + (t[1].is<int64_t>() ? std::to_string(t[1].get<int64_t>()) : kind_of(t[1])) +
                       " is out of range (the op has " + std::to_string(n_inputs) + ")");
        if (tag == "size") integer(t[2], at, 0, DIMS - 1);
        constant = false;
      } else if (tag == "op") {
        one_of(t[1], at, binary);
        pops = 2;
      } else if (tag == "unary") {
        one_of(t[1], at, unary);
        pops = 1;
      } else {
        const std::string& name = one_of(t[1], at, tag == "bool" ? logic : calls);
        pops = static_cast<size_t>(integer(t[2], at, 1, name == "next_pow2" ? 1 : PROGRAM_TOKENS));
      }
      size_t start = i;
      if (pops) {
        if (pops > stack.size()) fail(at, "pops more values than the program pushed");
        std::vector<std::pair<size_t, bool>> operands(stack.end() - pops, stack.end());
        stack.resize(stack.size() - pops);
        constant = std::all_of(operands.begin(), operands.end(), [](const auto& o) { return o.second; });
        if (!constant) {
          for (size_t k = 0; k < operands.size(); ++k) {
            if (!operands[k].second) continue;
            size_t end = k + 1 < operands.size() ? operands[k + 1].first : i;
            Value c = evaluate(tokens, operands[k].first, end, at);
            bool divisor = k == 1 && tag == "op" && (t[1].get<std::string>() == "//" || t[1].get<std::string>() == "%" ||
                                                     t[1].get<std::string>() == "/");
            if (divisor && ((c.kind == Value::Int && c.i == 0) || (c.kind == Value::Float && c.f == 0.0)))
              fail(at, "divides by a constant zero");
          }
        }
        start = operands[0].first;
      }
      stack.emplace_back(start, constant);
    }
    if (stack.size() != 1)
      fail(path, "leaves " + std::to_string(stack.size()) + " values on the stack, not 1");
    if (!stack[0].second) return false;
    Value c = evaluate(tokens, 0, tokens.size(), path);
    if (value) *value = c;
    return true;
  }

  // The value of tokens[begin, end), a constant subprogram; fails when it is an error.
  Value evaluate(const picojson::array& tokens, size_t begin, size_t end, const std::string& path) const {
    Program p(Json(picojson::array(tokens.begin() + begin, tokens.begin() + end)), 0, path);
    Value v = p.run({});
    if (v.kind == Value::Error) fail(path, std::string("a constant part is an error (") + v.why + ")");
    return v;
  }

  int64_t version() const { return version_; }

 private:
  std::string where_;
  int64_t version_;
  std::set<std::string> texts_;
  int64_t expr_chars_ = 0;
  int64_t tokens_ = 0;
};

// "" when `name` can name an op parameter, else why not.
std::string param_name_problem(const Json& v) {
  if (!v.is<std::string>()) return "is " + kind_of(v) + ", not a string";
  const std::string& name = v.get<std::string>();
  if (static_cast<int64_t>(chars(name)) > NAME_CHARS || !identifier(name))
    return quoted(name) + " is not an identifier of at most " + std::to_string(NAME_CHARS) + " characters";
  if (set_of(kReservedParams).count(name) || (name.rfind("out", 0) == 0 && digits(name, 3)))
    return quoted(name) + " is reserved (a keyword, an expression function or an output's name)";
  return "";
}

// The schema text of a default of `kind` (Python's str() of it), or false when it is not one.
bool default_text(const std::string& kind, const Json& v, std::string* out) {
  if (v.is<picojson::null>()) { *out = "None"; return true; }
  if (kind == "int" && v.is<int64_t>()) { *out = std::to_string(v.get<int64_t>()); return true; }
  if (kind == "float" && v.is<double>()) { *out = canonical_json(v); return true; }  // Python's repr
  if (kind == "bool" && v.is<bool>()) { *out = v.get<bool>() ? "True" : "False"; return true; }
  if (kind == "str" && v.is<std::string>()) {
    const std::string& s = v.get<std::string>();
    if (static_cast<int64_t>(chars(s)) > TEXT_CHARS || s.find_first_not_of(str_default_chars()) != std::string::npos)
      return false;
    *out = "\"" + s + "\"";
    return true;
  }
  if (kind == "dtype" && v.is<std::string>() && set_of(kDtypes).count(v.get<std::string>())) {
    *out = v.get<std::string>();
    return true;
  }
  return false;
}

// The parameters of `schema`, or false with `why`.
bool parse_schema(const std::string& schema, std::vector<SchemaParam>* params, std::string* returns, std::string* why) {
  size_t arrow = schema.rfind(") -> ");
  if (arrow == std::string::npos || schema.empty() || schema[0] != '(') {
    *why = "is not '(PARAMS) -> RETURNS'";
    return false;
  }
  *returns = schema.substr(arrow + 5);
  std::string head = schema.substr(1, arrow - 1);
  size_t at = 0;
  while (!head.empty() && at <= head.size()) {
    size_t end = head.find(", ", at);
    std::string part = head.substr(at, end == std::string::npos ? std::string::npos : end - at);
    at = end == std::string::npos ? head.size() + 1 : end + 2;
    SchemaParam p;
    static const char* types[] = {"Tensor", "SymInt", "float", "bool", "str", "ScalarType"};
    size_t i = 0;
    for (const char* t : types) {
      std::string ts(t);
      if (part.compare(0, ts.size(), ts) == 0 && (part.size() > ts.size()) &&
          (part[ts.size()] == ' ' || part[ts.size()] == '(' || part[ts.size()] == '[' || part[ts.size()] == '?')) {
        p.type = ts;
        i = ts.size();
        break;
      }
    }
    bool ok = !p.type.empty();
    if (ok && part.compare(i, 2, "(a") == 0) {
      size_t close = part.find("!)", i);
      ok = close != std::string::npos && close > i + 2 && digits(part.substr(i + 2, close - i - 2), 0) && close - i - 2 <= 18;
      if (ok) {
        p.alias = std::stoll(part.substr(i + 2, close - i - 2));
        i = close + 2;
      }
    }
    if (ok && part.compare(i, 2, "[]") == 0) { p.is_list = true; i += 2; }
    if (ok && i < part.size() && part[i] == '?') { p.optional = true; ++i; }
    ok = ok && i < part.size() && part[i] == ' ';
    if (ok) {
      size_t eq = part.find('=', i + 1);
      p.name = part.substr(i + 1, eq == std::string::npos ? std::string::npos : eq - i - 1);
      if (eq != std::string::npos) { p.has_default = true; p.default_text = part.substr(eq + 1); }
      ok = identifier(p.name);
    }
    if (!ok) {
      *why = "parameter " + quoted(part) + " is not 'TYPE NAME[=DEFAULT]'";
      return false;
    }
    params->push_back(std::move(p));
  }
  return true;
}

std::string returns_text(const std::string& returns, int64_t n) {
  if (returns == "none") return "()";
  if (returns == "tensor") return "Tensor";
  if (n == 1) return "((Tensor))";
  std::string out = "(";
  for (int64_t i = 0; i < n; ++i) out += (i ? ", Tensor" : "Tensor");
  return out + ")";
}

using Kinds = std::map<std::string, std::string>;  // param name -> kind

void check_param(const Walk& w, const picojson::object& p, const std::string& path) {
  std::string why = param_name_problem(w.field(p, "name", path));
  if (!why.empty()) w.fail(path + ".name", why);
  std::set<std::string> kinds;
  for (const auto& kv : param_kinds()) kinds.insert(kv.first);
  const std::string& kind = w.one_of(w.field(p, "kind", path), path + ".kind", kinds);
  bool tensor = param_kinds().at(kind).tensor;
  bool optional = w.boolean(w.field(p, "optional", path), path + ".optional");
  bool mutated = w.boolean(w.field(p, "mutated", path), path + ".mutated");
  bool required = w.boolean(w.field(p, "required", path), path + ".required");
  if (mutated && !tensor) w.fail(path + ".mutated", "a " + kind + " parameter cannot be mutated");
  const Json& d = w.field(p, "default", path);
  if (required) {
    if (!d.is<picojson::null>()) w.fail(path + ".default", "a required parameter has no default");
    return;
  }
  std::string text;
  if (d.is<picojson::null>()) {
    if (!optional) w.fail(path + ".default", "is None for a parameter that is not optional");
  } else if (tensor || !default_text(kind, d, &text)) {
    w.fail(path + ".default", "is not a default of a " + kind + " parameter");
  }
}

void check_schema(const Walk& w, const Json& schema, const picojson::array& params, const std::string& returns,
                  int64_t n_returns, const std::string& path) {
  if (!schema.is<std::string>()) w.fail(path, "is " + kind_of(schema) + ", not a string");
  std::vector<SchemaParam> written;
  std::string ret, why;
  if (!parse_schema(schema.get<std::string>(), &written, &ret, &why)) w.fail(path, why);
  if (written.size() != params.size())
    w.fail(path, "has " + std::to_string(written.size()) + " parameters, the op " + std::to_string(params.size()));
  for (size_t i = 0; i < written.size(); ++i) {
    const SchemaParam& s = written[i];
    const auto& p = params[i].get<picojson::object>();
    std::string at = path + " parameter " + std::to_string(i);
    const std::string& name = p.at("name").get<std::string>();
    const std::string& kind = p.at("kind").get<std::string>();
    bool optional = p.at("optional").get<bool>(), mutated = p.at("mutated").get<bool>();
    bool required = p.at("required").get<bool>();
    const std::string& schema_type = param_kinds().at(kind).schema_type;
    if (s.name != name) w.fail(at, "is named " + quoted(s.name) + ", the op's parameter " + quoted(name));
    if (s.type + (s.is_list ? "[]" : "") != schema_type)
      w.fail(at, name + " is " + s.type + (s.is_list ? "[]" : "") + ", a " + kind + " parameter is " + schema_type);
    if ((s.alias >= 0) != mutated || (s.alias >= 0 && s.alias != static_cast<int64_t>(i)))
      w.fail(at, name + ": the alias (a" + std::to_string(i) + "!) must mark exactly a mutated parameter");
    bool none_default = s.has_default && s.default_text == "None";
    if ((s.optional && !optional) || (s.optional && s.is_list) || (optional && !s.optional && !none_default))
      w.fail(at, name + ": '?' must mark exactly an optional parameter");
    std::string want;
    bool has_want = !required && default_text(kind, p.at("default"), &want);
    if (s.has_default != has_want || (has_want && s.default_text != want))
      w.fail(at, name + " has default " + (s.has_default ? quoted(s.default_text) : "None") + ", the op's is " +
                     (has_want ? quoted(want) : "None"));
  }
  if (ret != returns_text(returns, n_returns))
    w.fail(path, "returns " + quoted(ret) + ", the op returns '" + returns_text(returns, n_returns) + "'");
}

const picojson::object& names(const Walk& w, const Json& v, const std::string& path,
                              const std::function<bool(const std::string&)>& allowed, const std::string& what) {
  const auto& o = w.obj(v, path);
  if (static_cast<int64_t>(o.size()) > PARAMS + RETURNS)
    w.fail(path, "has " + std::to_string(o.size()) + " keys, over the cap of " + std::to_string(PARAMS + RETURNS));
  for (const auto& kv : o)
    if (!allowed(kv.first)) w.fail(path, quoted(kv.first) + " is not " + what);
  return o;
}

void check_images(const Walk& w, const picojson::object& images, const std::string& path) {
  for (const auto& kv : images) {
    std::string at = path + "." + kv.first;
    w.one_of(Json(kv.first), at, set_of(kImageKinds));
    const auto& image = w.obj(kv.second, at);
    const std::string& file = w.string(w.field(image, "file", at), at + ".file", NAME_CHARS, "NAME_CHARS");
    if (!bin_file(file)) w.fail(at + ".file", quoted(file) + " is outside the bundle's bin/ (or not a file name)");
    const Json& digest = w.field(image, "sha256", at);
    if (!digest.is<std::string>() || !sha256_hex(digest.get<std::string>())) w.fail(at + ".sha256", "is not a sha256 in hex");
    w.integer(w.field(image, "bytes", at), at + ".bytes", 0, FILE_BYTES);
  }
  if (images.count("so")) {
    if (!images.count("runtime") || images.count("cubin"))
      w.fail(path, "a library (so) comes with its runtime and no cubin");
  } else if (!images.count("cubin") || images.count("runtime")) {
    w.fail(path, "a kernel has a cubin (or a library so with its runtime)");
  }
}

// The manifest's dtypes agree with the types the kernel's compiler recorded.
void check_types(const Walk& w, const picojson::object& k, const picojson::array& kparams,
                 const picojson::object& dtypes, const picojson::array& out_dtypes, const std::string& path) {
  std::map<std::string, std::string> sources;
  for (const auto& kv : dtypes) sources[kv.first] = kv.second.get<std::string>();
  for (size_t i = 0; i < out_dtypes.size(); ++i) sources["out" + std::to_string(i)] = out_dtypes[i].get<std::string>();
  std::vector<std::string> pointers;  // "" where the source has no dtype
  for (const auto& p : kparams) {
    const auto& po = p.get<picojson::object>();
    auto s = po.find("source");
    if (s != po.end()) {
      auto d = sources.find(s->second.get<std::string>());
      pointers.push_back(d == sources.end() ? "" : d->second);
    }
  }
  auto triton = k.find("triton");
  if (triton != k.end() && triton->second.is<picojson::object>() && triton->second.contains("signature") &&
      triton->second.get("signature").is<picojson::object>()) {
    bool known = std::all_of(pointers.begin(), pointers.end(), [](const std::string& d) { return triton_types().count(d) > 0; });
    if (known) {
      std::vector<std::string> compiled, claimed;
      for (const auto& kv : triton->second.get("signature").get<picojson::object>())
        if (kv.second.is<std::string>() && kv.second.get<std::string>().rfind("*", 0) == 0)
          compiled.push_back(kv.second.get<std::string>());
      for (const auto& d : pointers) claimed.push_back("*" + triton_types().at(d));
      std::sort(compiled.begin(), compiled.end());
      std::sort(claimed.begin(), claimed.end());
      if (compiled != claimed) w.fail(path + ".dtypes", "give pointer types other than the kernel was compiled for");
    }
  }
  auto cuda = k.find("cuda");
  if (cuda != k.end() && cuda->second.is<picojson::object>() && cuda->second.contains("template") &&
      cuda->second.get("template").is<picojson::object>()) {
    for (const auto& kv : cuda->second.get("template").get<picojson::object>()) {
      if (!kv.second.is<std::string>()) continue;
      auto want = c_types().find(kv.second.get<std::string>());
      if (want == c_types().end()) continue;
      bool found = false;
      for (const auto& s : sources) found |= s.second == want->second;
      if (!found)
        w.fail(path + ".dtypes", "template argument " + kv.first + "=" + kv.second.get<std::string>() +
                                     " is compiled for " + want->second + ", which no tensor of the kernel has");
    }
  }
}

struct OpShape {
  Kinds kinds;
  std::vector<std::string> params;
  int64_t n_returns;
};

void check_programs(Walk& w, const picojson::object& prog, const std::string& path, const OpShape& op,
                    size_t n_params, size_t n_dims_rows, const std::vector<bool>& scalar,
                    const std::vector<size_t>& dims) {
  size_t n = op.params.size();
  w.program(w.field(prog, "guard", path), path + ".guard", n);
  const auto& grid = w.lst(w.field(prog, "grid", path), path + ".grid", -1, "", 3);
  for (int d = 0; d < 3; ++d) {
    std::string at = path + ".grid[" + std::to_string(d) + "]";
    Value v;
    if (w.program(grid[d], at, n, &v) && (v.kind != Value::Int || v.i < 1 || v.i > kMaxGrid[d]))
      w.fail(at, describe(v) + " is outside the device limits (1.." + std::to_string(kMaxGrid[d]) + ")");
  }
  Value v;
  if (w.program(w.field(prog, "shared_mem", path), path + ".shared_mem", n, &v) &&
      (v.kind != Value::Int || v.i < 0 || v.i > kMaxShared))
    w.fail(path + ".shared_mem", describe(v) + " bytes is outside 0.." + std::to_string(kMaxShared));
  const auto& params = w.lst(w.field(prog, "params", path), path + ".params", -1, "", static_cast<int64_t>(n_params));
  for (size_t i = 0; i < params.size(); ++i) {
    std::string at = path + ".params[" + std::to_string(i) + "]";
    if (scalar[i] == params[i].is<picojson::null>()) w.fail(at, "a pointer has no program, a scalar has one");
    if (scalar[i]) w.program(params[i], at, n);
  }
  const auto& outputs = w.lst(w.field(prog, "outputs", path), path + ".outputs", -1, "", static_cast<int64_t>(n_dims_rows));
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::string at = path + ".outputs[" + std::to_string(i) + "]";
    const auto& d = w.lst(outputs[i], at, -1, "", static_cast<int64_t>(dims[i]));
    for (size_t j = 0; j < d.size(); ++j) w.program(d[j], at + "[" + std::to_string(j) + "]", n);
  }
}

void check_kernel(Walk& w, const picojson::object& k, const std::string& path, const OpShape& op,
                  const std::set<std::string>& archs) {
  const Kinds& kinds = op.kinds;
  auto tensor = [&](const std::string& n) { auto it = kinds.find(n); return it != kinds.end() && it->second == "tensor"; };
  auto output = [&](const std::string& n) {
    if (n.rfind("out", 0) != 0 || n.size() < 4 || n.size() > 5 || !digits(n, 3) || (n.size() == 5 && n[3] == '0'))
      return false;
    return std::stoll(n.substr(3)) < op.n_returns;
  };
  w.one_of(w.field(k, "arch", path), path + ".arch", archs);
  const std::string& name = w.string(w.field(k, "kernel", path), path + ".kernel", NAME_CHARS, "NAME_CHARS");
  if (name.empty()) w.fail(path + ".kernel", "is empty");
  w.boolean(w.field(k, "dynamic", path), path + ".dynamic");
  const auto& dtypes = names(w, w.field(k, "dtypes", path), path + ".dtypes", tensor, "a tensor parameter");
  for (const auto& kv : dtypes) w.one_of(kv.second, path + ".dtypes." + kv.first, set_of(kDtypes));
  for (const auto& kv : names(w, w.field(k, "ranks", path), path + ".ranks", tensor, "a tensor parameter"))
    w.integer(kv.second, path + ".ranks." + kv.first, 0, DIMS);
  auto pinned = k.find("pinned");
  if (pinned != k.end()) {
    if (w.version() < 3) w.fail(path + ".pinned", "needs manifest version 3");
    auto str = [&](const std::string& n) { auto it = kinds.find(n); return it != kinds.end() && it->second == "str"; };
    for (const auto& kv : names(w, pinned->second, path + ".pinned", str, "a str parameter"))
      w.string(kv.second, path + ".pinned." + kv.first);
  }
  const auto& aligned = w.lst(w.field(k, "aligned", path), path + ".aligned", PARAMS, "PARAMS");
  for (size_t i = 0; i < aligned.size(); ++i) {
    const Json& n = aligned[i];
    bool ok = n.is<std::string>() && (tensor(n.get<std::string>()) || output(n.get<std::string>()) ||
                                      (kinds.count(n.get<std::string>()) && kinds.at(n.get<std::string>()) == "tensor_list"));
    if (!ok) w.fail(path + ".aligned[" + std::to_string(i) + "]", "is not a tensor parameter or output");
  }
  const auto& guards = w.lst(w.field(k, "guards", path), path + ".guards", GUARDS, "GUARDS");
  for (size_t i = 0; i < guards.size(); ++i) w.expr(guards[i], path + ".guards[" + std::to_string(i) + "]");
  const auto& grid = w.lst(w.field(k, "grid", path), path + ".grid", -1, "", 3);
  for (size_t i = 0; i < grid.size(); ++i) w.expr(grid[i], path + ".grid[" + std::to_string(i) + "]");
  w.expr(w.field(k, "shared_mem", path), path + ".shared_mem");
  const auto& block = w.lst(w.field(k, "block", path), path + ".block", -1, "", 3);
  int64_t threads = 1;
  for (int d = 0; d < 3; ++d) threads *= w.integer(block[d], path + ".block[" + std::to_string(d) + "]", 1, kMaxBlock[d]);
  if (threads > kMaxThreads) w.fail(path + ".block", "has " + std::to_string(threads) + " threads, over 1024");
  const auto& kparams = w.lst(w.field(k, "params", path), path + ".params", KERNEL_PARAMS, "KERNEL_PARAMS");
  std::vector<bool> scalar;
  for (size_t i = 0; i < kparams.size(); ++i) {
    std::string at = path + ".params[" + std::to_string(i) + "]";
    const auto& p = w.obj(kparams[i], at);
    const std::string& kind = w.one_of(w.field(p, "kind", at), at + ".kind", set_of(kKernelKinds));
    if (kind == "ptr") {
      auto null = p.find("null");
      bool is_null = null != p.end() && null->second.is<bool>() && null->second.get<bool>();
      if (p.count("expr") || p.count("source") == static_cast<size_t>(is_null))
        w.fail(at, "a pointer has either a source or \"null\": true");
      auto s = p.find("source");
      if (s != p.end() && !(s->second.is<std::string>() && (tensor(s->second.get<std::string>()) || output(s->second.get<std::string>()))))
        w.fail(at + ".source", "is not a tensor parameter or output");
      scalar.push_back(false);
    } else {
      if (p.count("source") || p.count("null")) w.fail(at, "a " + kind + " parameter has an expr, not a source");
      w.expr(w.field(p, "expr", at), at + ".expr");
      scalar.push_back(true);
    }
  }
  const auto& outputs = w.obj(w.field(k, "outputs", path), path + ".outputs");
  const auto& shapes = w.lst(w.field(outputs, "shapes", path + ".outputs"), path + ".outputs.shapes", -1, "", op.n_returns);
  std::vector<size_t> dims;
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::string at = path + ".outputs.shapes[" + std::to_string(i) + "]";
    const auto& s = w.lst(shapes[i], at, DIMS, "DIMS");
    for (size_t j = 0; j < s.size(); ++j) w.expr(s[j], at + "[" + std::to_string(j) + "]");
    dims.push_back(s.size());
  }
  const auto& out_dtypes = w.lst(w.field(outputs, "dtypes", path + ".outputs"), path + ".outputs.dtypes", -1, "", op.n_returns);
  for (size_t i = 0; i < out_dtypes.size(); ++i) w.one_of(out_dtypes[i], path + ".outputs.dtypes[" + std::to_string(i) + "]", set_of(kDtypes));
  check_images(w, w.obj(w.field(k, "images", path), path + ".images"), path + ".images");
  check_types(w, k, kparams, dtypes, out_dtypes, path);
  check_programs(w, w.obj(w.field(k, "program", path), path + ".program"), path + ".program", op, kparams.size(),
                 shapes.size(), scalar, dims);
}

std::string candidate_key(Walk& w, const picojson::object& c, const std::string& path, const OpShape& op,
                          const std::set<std::string>& archs) {
  int64_t index = w.integer(w.field(c, "index", path), path + ".index", 0, CANDIDATES);
  for (const char* key : {"backend", "impl", "impl_fingerprint", "label"}) w.string(w.field(c, key, path), path + "." + key);
  const auto& config = w.obj(w.field(c, "config", path), path + ".config");
  if (static_cast<int64_t>(config.size()) > CONFIG_KEYS)
    w.fail(path + ".config", "has " + std::to_string(config.size()) + " keys, over the cap of " +
                                 std::to_string(CONFIG_KEYS) + " (CONFIG_KEYS)");
  for (const auto& kv : config) {
    if (static_cast<int64_t>(chars(kv.first)) > NAME_CHARS || !identifier(kv.first))
      w.fail(path + ".config", "key " + quoted(kv.first) + " is not an identifier");
    std::string at = path + ".config." + kv.first;
    if (kv.second.is<picojson::array>()) {
      for (const auto& item : w.lst(kv.second, at, CONFIG_KEYS, "CONFIG_KEYS")) w.scalar(item, at);
    } else {
      w.scalar(kv.second, at);
    }
  }
  const auto& kernels = w.lst(w.field(c, "kernels", path), path + ".kernels", KERNELS, "KERNELS");
  for (size_t i = 0; i < kernels.size(); ++i) {
    std::string at = path + ".kernels[" + std::to_string(i) + "]";
    check_kernel(w, w.obj(kernels[i], at), at, op, archs);
  }
  return std::to_string(index) + " " + canonical_json(Json(config));
}

// _program.meta_rules: the distinct output rules of the kernels, symbolic and fewer guards first.
std::vector<Json> meta_rules(const picojson::array& candidates) {
  std::vector<Json> rules;
  std::set<std::string> seen;
  for (const auto& c : candidates)
    for (const auto& kv : c.get("kernels").get<picojson::array>()) {
      const auto& k = kv.get<picojson::object>();
      picojson::object rule;
      rule["dtypes"] = k.at("dtypes");
      rule["ranks"] = k.at("ranks");
      rule["guards"] = k.at("guards");
      rule["guard"] = k.at("program").get("guard");
      rule["dynamic"] = k.at("dynamic");
      rule["shapes"] = k.at("program").get("outputs");
      rule["out_dtypes"] = k.at("outputs").get("dtypes");
      auto pinned = k.find("pinned");
      if (pinned != k.end() && !pinned->second.get<picojson::object>().empty()) rule["pinned"] = pinned->second;
      Json value(rule);
      if (seen.insert(canonical_json(value)).second) rules.push_back(value);
    }
  std::stable_sort(rules.begin(), rules.end(), [](const Json& a, const Json& b) {
    auto key = [](const Json& r) {
      return std::make_pair(!r.get("dynamic").get<bool>(), r.get("guards").get<picojson::array>().size());
    };
    return key(a) < key(b);
  });
  return rules;
}

void check_decision(const Walk& w, const picojson::object& row, const std::string& path, const Kinds& kinds,
                    size_t n_candidates) {
  w.string(w.field(row, "arch", path), path + ".arch");
  auto tensor = [&](const std::string& n) { auto it = kinds.find(n); return it != kinds.end() && it->second == "tensor"; };
  auto param = [&](const std::string& n) { return kinds.count(n) > 0; };
  for (const auto& kv : names(w, w.field(row, "tensors", path), path + ".tensors", tensor, "a tensor parameter")) {
    std::string at = path + ".tensors." + kv.first;
    const auto& t = w.obj(kv.second, at);
    w.one_of(w.field(t, "dtype", at), at + ".dtype", set_of(kDtypes));
    const auto& dims = w.lst(w.field(t, "dims", at), at + ".dims", DIMS, "DIMS");
    for (size_t d = 0; d < dims.size(); ++d) {
      std::string ad = at + ".dims[" + std::to_string(d) + "]";
      for (const auto& v : w.lst(dims[d], ad, -1, "", 2)) w.integer(v, ad, INT64_MIN, INT64_MAX);
    }
  }
  for (const auto& kv : names(w, w.field(row, "ints", path), path + ".ints", param, "a parameter"))
    for (const auto& v : w.lst(kv.second, path + ".ints." + kv.first, -1, "", 2))
      w.integer(v, path + ".ints." + kv.first, INT64_MIN, INT64_MAX);
  for (const auto& kv : names(w, w.field(row, "values", path), path + ".values", param, "a parameter"))
    w.scalar(kv.second, path + ".values." + kv.first);
  const auto& ranking = w.lst(w.field(row, "ranking", path), path + ".ranking", CANDIDATES, "CANDIDATES");
  for (size_t i = 0; i < ranking.size(); ++i)
    w.integer(ranking[i], path + ".ranking[" + std::to_string(i) + "]", 0, static_cast<int64_t>(n_candidates) - 1);
  auto source = row.find("source");
  if (source != row.end()) w.string(source->second, path + ".source");
}

std::string check_op(Walk& w, const picojson::object& op, const std::string& path, const std::set<std::string>& archs) {
  const Json& name = w.field(op, "name", path);
  if (!name.is<std::string>()) w.fail(path + ".name", "is " + kind_of(name) + ", not a string");
  const std::string& qualified = name.get<std::string>();
  size_t sep = qualified.find("::");
  if (static_cast<int64_t>(chars(qualified)) > NAME_CHARS)
    w.fail(path + ".name", "is " + std::to_string(chars(qualified)) + " characters, over the cap of " +
                               std::to_string(NAME_CHARS) + " (NAME_CHARS)");
  if (sep == std::string::npos || !identifier(qualified.substr(0, sep)) || !identifier(qualified.substr(sep + 2)))
    w.fail(path + ".name", quoted(qualified) + " is not NAMESPACE::NAME with identifier parts");
  if (set_of(kNamespaces).count(qualified.substr(0, sep)))
    w.fail(path + ".name", quoted(qualified) + ": namespace '" + qualified.substr(0, sep) + "' belongs to PyTorch");
  w.string(w.field(op, "fingerprint", path), path + ".fingerprint");
  for (const char* key : {"module", "doc"}) {
    auto it = op.find(key);
    if (it != op.end() && !it->second.is<picojson::null>()) w.string(it->second, path + "." + key);
  }
  const auto& params = w.lst(w.field(op, "params", path), path + ".params", PARAMS, "PARAMS");
  OpShape shape;
  for (size_t i = 0; i < params.size(); ++i) {
    std::string at = path + ".params[" + std::to_string(i) + "]";
    check_param(w, w.obj(params[i], at), at);
  }
  std::vector<std::string> mutated;
  for (const auto& p : params) {
    const std::string& n = p.get("name").get<std::string>();
    if (shape.kinds.count(n)) w.fail(path + ".params", "name a parameter twice");
    shape.kinds[n] = p.get("kind").get<std::string>();
    shape.params.push_back(n);
    if (p.get("mutated").get<bool>()) mutated.push_back(n);
  }
  static const std::set<std::string> returns_kinds = {"none", "tensor", "tuple"};
  const std::string& returns = w.one_of(w.field(op, "returns", path), path + ".returns", returns_kinds);
  int64_t lo = returns == "none" ? 0 : 1, hi = returns == "none" ? 0 : returns == "tensor" ? 1 : RETURNS;
  shape.n_returns = w.integer(w.field(op, "n_returns", path), path + ".n_returns", lo, hi);
  const auto& mutates = w.lst(w.field(op, "mutates_args", path), path + ".mutates_args", PARAMS, "PARAMS");
  std::vector<std::string> listed;
  for (const auto& m : mutates) {
    if (!m.is<std::string>()) w.fail(path + ".mutates_args", "are not the mutated parameters");
    listed.push_back(m.get<std::string>());
  }
  std::sort(listed.begin(), listed.end());
  std::sort(mutated.begin(), mutated.end());
  if (listed != mutated || std::adjacent_find(listed.begin(), listed.end()) != listed.end())
    w.fail(path + ".mutates_args", "are not the mutated parameters");
  check_schema(w, w.field(op, "schema", path), params, returns, shape.n_returns, path + ".schema");
  const auto& candidates = w.lst(w.field(op, "candidates", path), path + ".candidates", CANDIDATES, "CANDIDATES");
  std::set<std::string> seen;
  for (size_t i = 0; i < candidates.size(); ++i) {
    std::string at = path + ".candidates[" + std::to_string(i) + "]";
    if (!seen.insert(candidate_key(w, w.obj(candidates[i], at), at, shape, archs)).second)
      w.fail(at, "repeats the index and config of an earlier candidate");
  }
  const auto& meta = w.lst(w.field(op, "meta", path), path + ".meta");
  std::vector<Json> want = meta_rules(candidates);
  bool same = meta.size() == want.size();
  for (size_t i = 0; same && i < meta.size(); ++i) same = canonical_json(meta[i]) == canonical_json(want[i]);
  if (!same) w.fail(path + ".meta", "is not the output rules its kernels give (rebuild the bundle)");
  const auto& rows = w.lst(w.field(op, "decisions", path), path + ".decisions", DECISIONS, "DECISIONS");
  for (size_t i = 0; i < rows.size(); ++i) {
    std::string at = path + ".decisions[" + std::to_string(i) + "]";
    check_decision(w, w.obj(rows[i], at), at, shape.kinds, candidates.size());
  }
  return qualified;
}

}  // namespace

bool readable_version(int64_t version) {
#define KG_VERSION(number, has_programs) \
  if (version == number) return has_programs != 0;
#include "bundle_spec.h"
  return false;
}

const std::vector<std::string>& dtypes() {
  static const std::vector<std::string> names = {
#define KG_DTYPE(name, scalar_type) name,
#include "bundle_spec.h"
  };
  return names;
}

void check_manifest(const Json& manifest, const std::string& where) {
  Walk w(where, manifest.get("version").get<int64_t>());
  const auto& m = w.obj(manifest, "manifest");
  const auto& archs = w.lst(w.field(m, "archs", "archs"), "archs", ARCHS, "ARCHS");
  if (archs.empty()) w.fail("archs", "is empty");
  std::set<std::string> arch_set;
  for (size_t i = 0; i < archs.size(); ++i) {
    if (!archs[i].is<std::string>() || !arch_name(archs[i].get<std::string>()))
      w.fail("archs[" + std::to_string(i) + "]", "is not an arch name sm_NN");
    arch_set.insert(archs[i].get<std::string>());
  }
  if (arch_set.size() != archs.size()) w.fail("archs", "names an arch twice");
  w.obj(w.field(m, "toolchain", "toolchain"), "toolchain");
  const auto& ops = w.lst(w.field(m, "ops", "ops"), "ops", OPS, "OPS");
  std::set<std::string> names_seen;
  for (size_t i = 0; i < ops.size(); ++i) {
    std::string at = "ops[" + std::to_string(i) + "]";
    std::string name = check_op(w, w.obj(ops[i], at), at, arch_set);
    if (!names_seen.insert(name).second) w.fail(at + ".name", quoted(name) + " names two ops");
  }
}

}  // namespace spec
}  // namespace kgrt
