// The schema grammar of the bundle spec (kernelgraft/aot/bundle_spec.py states it) and the
// check that an op's schema is exactly its parameters, in C++.
#include "spec_walk.h"

namespace kgrt {
namespace spec {
namespace detail {
namespace {

// A schema parameter: TYPE[(aN!)][[]][?] NAME[=DEFAULT].
struct SchemaParam {
  std::string type, name, default_text;
  int64_t alias = -1;
  bool is_list = false, optional = false, has_default = false;
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

}  // namespace

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

}  // namespace detail
}  // namespace spec
}  // namespace kgrt
