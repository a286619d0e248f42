#include "json.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "spec.h"

namespace kgrt {

namespace {

bool json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Well-formed UTF-8 as Python's strict decoder reads it: no overlong forms, no surrogates, at
// most U+10FFFF. Returns the offset of the first bad byte, or npos.
size_t bad_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    if (c < 0x80) { ++i; continue; }
    size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || c == 0xC0 || c == 0xC1 || c > 0xF4 || i + len > s.size()) return i;
    unsigned char c1 = s[i + 1];
    if ((c1 & 0xC0) != 0x80) return i;
    if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F) || (c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 > 0x8F))
      return i;
    for (size_t k = 2; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return i;
    i += len;
  }
  return std::string::npos;
}

// A JSON number lexeme (RFC 8259) whose value Python's json reads exactly: an integer within
// int64, or a finite float. Empty when it is one, else why not.
std::string bad_number(const std::string& t) {
  size_t i = 0, n = t.size();
  if (i < n && t[i] == '-') ++i;
  size_t int_start = i;
  if (i < n && t[i] == '0') ++i;
  else if (i < n && t[i] >= '1' && t[i] <= '9') while (i < n && isdigit(static_cast<unsigned char>(t[i]))) ++i;
  else return "'" + t.substr(0, 40) + "' is not a JSON number";
  size_t int_end = i;
  bool integer = true;
  if (i < n && t[i] == '.') {
    integer = false;
    size_t d = ++i;
    while (i < n && isdigit(static_cast<unsigned char>(t[i]))) ++i;
    if (i == d) return "'" + t.substr(0, 40) + "' is not a JSON number";
  }
  if (i < n && (t[i] == 'e' || t[i] == 'E')) {
    integer = false;
    ++i;
    if (i < n && (t[i] == '+' || t[i] == '-')) ++i;
    size_t d = i;
    while (i < n && isdigit(static_cast<unsigned char>(t[i]))) ++i;
    if (i == d) return "'" + t.substr(0, 40) + "' is not a JSON number";
  }
  if (i != n) return "'" + t.substr(0, 40) + "' is not a JSON number";
  if (integer) {
    std::string digits = t.substr(int_start, int_end - int_start);
    const std::string max = t[0] == '-' ? "9223372036854775808" : "9223372036854775807";
    if (digits.size() > max.size() || (digits.size() == max.size() && digits > max))
      return "the integer " + t.substr(0, 40) + " is outside int64";
    return "";
  }
  errno = 0;
  double d = std::strtod(t.c_str(), nullptr);
  if (!std::isfinite(d)) return "the number " + t.substr(0, 40) + " is not finite";
  return "";
}

// What picojson leaves to its caller: UTF-8, control characters in strings, the number grammar
// and ranges, and the nesting depth (before parsing, which recurses per level).
void prescan(const std::string& text, const std::string& where) {
  size_t bad = bad_utf8(text);
  if (bad != std::string::npos)
    throw BundleError(where + " is not valid JSON (not UTF-8 at byte " + std::to_string(bad) + ")");
  int64_t depth = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '"') {
      for (++i; i < text.size() && text[i] != '"'; ++i) {
        if (text[i] == '\\') ++i;
        else if (static_cast<unsigned char>(text[i]) < 0x20)
          throw BundleError(where + " is not valid JSON (a control character in a string)");
      }
    } else if (c == '[' || c == '{') {
      if (++depth > spec::JSON_DEPTH)
        throw BundleError(where + " nests deeper than " + std::to_string(spec::JSON_DEPTH) + " levels");
    } else if (c == ']' || c == '}') {
      --depth;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      size_t end = text.find_first_not_of("0123456789+-.eE", i);
      if (end == std::string::npos) end = text.size();
      std::string why = bad_number(text.substr(i, end - i));
      if (!why.empty()) throw BundleError(where + " is not valid JSON (" + why + ")");
      i = end - 1;
    }
  }
}

// picojson's default context, refusing a key that appears twice in one object.
class StrictContext {
 public:
  StrictContext(Json* out, std::string* repeated) : out_(out), repeated_(repeated) {}
  bool set_null() { *out_ = Json(); return true; }
  bool set_bool(bool b) { *out_ = Json(b); return true; }
  bool set_int64(int64_t i) { *out_ = Json(i); return true; }
  bool set_number(double f) { *out_ = Json(f); return true; }
  template <typename Iter> bool parse_string(picojson::input<Iter>& in) {
    *out_ = Json(picojson::string_type, false);
    return picojson::_parse_string(out_->get<std::string>(), in);
  }
  bool parse_array_start() { *out_ = Json(picojson::array_type, false); return true; }
  template <typename Iter> bool parse_array_item(picojson::input<Iter>& in, size_t) {
    picojson::array& a = out_->get<picojson::array>();
    a.push_back(Json());
    StrictContext ctx(&a.back(), repeated_);
    return picojson::_parse(ctx, in);
  }
  bool parse_array_stop(size_t) { return true; }
  bool parse_object_start() { *out_ = Json(picojson::object_type, false); return true; }
  template <typename Iter> bool parse_object_item(picojson::input<Iter>& in, const std::string& key) {
    picojson::object& o = out_->get<picojson::object>();
    if (o.count(key)) {
      *repeated_ = key;
      return false;
    }
    StrictContext ctx(&o[key], repeated_);
    return picojson::_parse(ctx, in);
  }
  bool parse_object_stop() { return true; }

 private:
  Json* out_;
  std::string* repeated_;
};

}  // namespace

Json parse_json(const std::string& text, const std::string& where) {
  prescan(text, where);
  Json out;
  std::string err, repeated;
  try {
    StrictContext ctx(&out, &repeated);
    auto end = picojson::_parse(ctx, text.begin(), text.end(), &err);
    if (err.empty())
      for (; end != text.end(); ++end)
        if (!json_space(*end)) {
          err = "extra data after the value";
          break;
        }
  } catch (const std::exception& e) {  // picojson throws on some malformed numbers
    err = std::string("a number out of range ") + e.what();
  }
  if (!repeated.empty()) err = "the key '" + repeated.substr(0, 40) + "' appears twice in one object";
  if (!err.empty()) throw BundleError(where + " is not valid JSON (" + err.substr(0, 200) + ")");
  return out;
}

namespace {

// Python's repr(float): the shortest digits that round-trip; exponent form when the decimal
// point falls outside -4 < decpt <= 16, else positional with at least one fractional digit.
void float_repr(double d, std::string& out) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string s(buf, res.ptr);  // e.g. "-1.2345e-06"
  bool negative = s[0] == '-';
  if (negative) s.erase(0, 1);
  size_t e = s.find('e');
  std::string digits = s.substr(0, e);
  int exp10 = std::atoi(s.c_str() + e + 1);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int decpt = exp10 + 1;  // value = 0.DIGITS * 10**decpt
  if (negative) out += '-';
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out.append(digits, 1, std::string::npos);
    }
    char e_buf[16];
    std::snprintf(e_buf, sizeof e_buf, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    out += e_buf;
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (static_cast<size_t>(decpt) >= digits.size()) {
    out += digits;
    out.append(decpt - digits.size(), '0');
    out += ".0";
  } else {
    out.append(digits, 0, decpt);
    out += '.';
    out.append(digits, decpt, std::string::npos);
  }
}

void escape_unit(unsigned unit, std::string& out) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\u%04x", unit);
  out += buf;
}

// Python's json string with ensure_ascii: every code point outside ' '..'~' escaped (UTF-16).
void string_repr(const std::string& s, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    unsigned cp;
    size_t len;
    if (c < 0x80) { cp = c; len = 1; }
    else if ((c & 0xE0) == 0xC0) { cp = c & 0x1F; len = 2; }
    else if ((c & 0xF0) == 0xE0) { cp = c & 0x0F; len = 3; }
    else if ((c & 0xF8) == 0xF0) { cp = c & 0x07; len = 4; }
    else throw BundleError("a manifest string is not UTF-8");
    if (i + len > s.size()) throw BundleError("a manifest string is not UTF-8");
    for (size_t k = 1; k < len; ++k) {
      unsigned char cc = s[i + k];
      if ((cc & 0xC0) != 0x80) throw BundleError("a manifest string is not UTF-8");
      cp = (cp << 6) | (cc & 0x3F);
    }
    i += len;
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (cp >= 0x20 && cp <= 0x7E) {
      out += static_cast<char>(cp);
    } else if (cp < 0x10000) {
      escape_unit(cp, out);
    } else {
      cp -= 0x10000;
      escape_unit(0xD800 | (cp >> 10), out);
      escape_unit(0xDC00 | (cp & 0x3FF), out);
    }
  }
  out += '"';
}

void write(const Json& v, std::string& out) {
  if (v.is<picojson::null>()) {
    out += "null";
  } else if (v.is<bool>()) {
    out += v.get<bool>() ? "true" : "false";
  } else if (v.is<int64_t>()) {
    out += std::to_string(v.get<int64_t>());
  } else if (v.is<double>()) {  // after int64: get<double>() would turn an int64 into a double
    float_repr(v.get<double>(), out);
  } else if (v.is<std::string>()) {
    string_repr(v.get<std::string>(), out);
  } else if (v.is<picojson::array>()) {
    out += '[';
    bool first = true;
    for (const auto& item : v.get<picojson::array>()) {
      if (!first) out += ',';
      first = false;
      write(item, out);
    }
    out += ']';
  } else {
    // std::map orders keys by UTF-8 bytes, which is the code point order Python sorts by.
    out += '{';
    bool first = true;
    for (const auto& kv : v.get<picojson::object>()) {
      if (!first) out += ',';
      first = false;
      string_repr(kv.first, out);
      out += ':';
      write(kv.second, out);
    }
    out += '}';
  }
}

}  // namespace

std::string canonical_json(const Json& value) {
  std::string out;
  write(value, out);
  return out;
}

const Json& field(const Json& object, const char* key, const std::string& where) {
  const auto& o = as_object(object, where);
  auto it = o.find(key);
  if (it == o.end()) throw BundleError(where + " lacks '" + key + "'");
  return it->second;
}

const std::string& as_string(const Json& v, const std::string& where) {
  if (!v.is<std::string>()) throw BundleError(where + " is not a string");
  return v.get<std::string>();
}

int64_t as_int(const Json& v, const std::string& where) {
  if (!v.is<int64_t>()) throw BundleError(where + " is not an integer");
  return v.get<int64_t>();
}

const picojson::array& as_array(const Json& v, const std::string& where) {
  if (!v.is<picojson::array>()) throw BundleError(where + " is not a list");
  return v.get<picojson::array>();
}

const picojson::object& as_object(const Json& v, const std::string& where) {
  if (!v.is<picojson::object>()) throw BundleError(where + " is not an object");
  return v.get<picojson::object>();
}

}  // namespace kgrt
