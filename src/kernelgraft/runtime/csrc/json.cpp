#include "json.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>

namespace kgrt {

Json parse_json(const std::string& text, const std::string& where) {
  Json out;
  std::string err;
  try {
    picojson::parse(out, text.begin(), text.end(), &err);
  } catch (const std::exception& e) {  // picojson throws on some malformed numbers
    err = e.what();
  }
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
