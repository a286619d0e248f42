// The tables of bundle_spec.h, the predicates and Walk's program check (spec_walk.h).
#include "spec_walk.h"

#include <algorithm>

namespace kgrt {
namespace spec {
namespace detail {

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

bool Walk::program(const Json& v, const std::string& path, size_t n_inputs, Value* value) {
  const auto& tokens = lst(v, path, PROGRAM_TOKENS, "PROGRAM_TOKENS");
  tokens_ += static_cast<int64_t>(tokens.size());
  if (tokens_ > PROGRAM_TOKENS_TOTAL)
    fail(path, "the programs pass the cap of " + std::to_string(PROGRAM_TOKENS_TOTAL) + " tokens (PROGRAM_TOKENS_TOTAL)");
  static const std::set<std::string> binary = {"+", "-", "*", "//", "%", "**", "|", "&", "<<", ">>", "/",
                                               "==", "!=", "<", "<=", ">", ">="};
  static const std::set<std::string> unary = {"neg", "pos", "not"}, logic = {"and", "or"},
                                     calls = {"min", "max", "next_pow2"};
  static const std::map<std::string, size_t> arity = {{"int", 2}, {"float", 2}, {"size", 3}, {"stride", 3},
                                                      {"arg", 2}, {"op", 2}, {"unary", 2}, {"bool", 3},
                                                      {"call", 3}};
  std::vector<std::pair<size_t, bool>> stack;  // (first token, constant) of each value
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string at = path + "[" + std::to_string(i) + "]";
    const Json& tv = tokens[i];
    if (!tv.is<picojson::array>() || tv.get<picojson::array>().empty() || !tv.get<picojson::array>()[0].is<std::string>())
      fail(at, "is not a token [TAG, ...]");
    const auto& t = tv.get<picojson::array>();
    const std::string& tag = t[0].get<std::string>();
    auto found = arity.find(tag);
    if (found == arity.end()) fail(at, quoted(tag) + " is not one of int/float/size/arg/op/unary/bool/call/stride");
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
    } else if (tag == "size" || tag == "stride" || tag == "arg") {
      if (!t[1].is<int64_t>() || t[1].get<int64_t>() < 0 || t[1].get<int64_t>() >= static_cast<int64_t>(n_inputs))
        fail(at, "input " + (t[1].is<int64_t>() ? std::to_string(t[1].get<int64_t>()) : kind_of(t[1])) +
                     " is out of range (the op has " + std::to_string(n_inputs) + ")");
      if (tag != "arg") integer(t[2], at, 0, DIMS - 1);
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

Value Walk::evaluate(const picojson::array& tokens, size_t begin, size_t end, const std::string& path) const {
  Program p(Json(picojson::array(tokens.begin() + begin, tokens.begin() + end)), 0, path);
  Value v = p.run({});
  if (v.kind == Value::Error) fail(path, std::string("a constant part is an error (") + v.why + ")");
  return v;
}

}  // namespace detail
}  // namespace spec
}  // namespace kgrt
