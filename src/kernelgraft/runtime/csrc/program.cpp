#include "program.h"

#include <charconv>
#include <cmath>
#include <limits>

namespace kgrt {
namespace {

constexpr i128 kMax = ~(i128(1) << 127);
constexpr i128 kMin = i128(1) << 127;

i128 parse_i128(const std::string& text, const std::string& where) {
  size_t i = 0;
  bool negative = !text.empty() && text[0] == '-';
  if (negative) i = 1;
  if (i == text.size()) throw BundleError(where + ": integer literal '" + text + "' is not a number");
  i128 v = 0;
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (c < '0' || c > '9') throw BundleError(where + ": integer literal '" + text + "' is not a number");
    // accumulate negatively: -2**127 is representable, 2**127 is not
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_sub_overflow(v, c - '0', &v))
      throw BundleError(where + ": integer literal '" + text + "' does not fit 128 bits");
  }
  if (!negative) {
    if (v == kMin) throw BundleError(where + ": integer literal '" + text + "' does not fit 128 bits");
    v = -v;
  }
  return v;
}

double as_double(const Value& v) { return v.kind == Value::Int ? static_cast<double>(v.i) : v.f; }
long double as_ldouble(const Value& v) { return v.kind == Value::Int ? static_cast<long double>(v.i) : v.f; }

// Python's float divmod (Objects/floatobject.c), so // and % of floats agree to the last bit.
void float_divmod(double vx, double wx, double* floordiv, double* mod) {
  double m = std::fmod(vx, wx);
  double div = (vx - m) / wx;
  if (m != 0.0) {
    if ((wx < 0) != (m < 0)) {
      m += wx;
      div -= 1.0;
    }
  } else {
    m = std::copysign(0.0, wx);
  }
  double fd;
  if (div != 0.0) {
    fd = std::floor(div);
    if (div - fd > 0.5) fd += 1.0;
  } else {
    fd = std::copysign(0.0, vx / wx);
  }
  *floordiv = fd;
  *mod = m;
}

Value compare(Token::Op op, const Value& a, const Value& b) {
  bool r;
  if (a.kind == Value::Int && b.kind == Value::Int) {
    switch (op) {
      case Token::Eq: r = a.i == b.i; break;
      case Token::Ne: r = a.i != b.i; break;
      case Token::Lt: r = a.i < b.i; break;
      case Token::Le: r = a.i <= b.i; break;
      case Token::Gt: r = a.i > b.i; break;
      default: r = a.i >= b.i; break;
    }
  } else {
    long double x = as_ldouble(a), y = as_ldouble(b);
    switch (op) {
      case Token::Eq: r = x == y; break;
      case Token::Ne: r = x != y; break;
      case Token::Lt: r = x < y; break;
      case Token::Le: r = x <= y; break;
      case Token::Gt: r = x > y; break;
      default: r = x >= y; break;
    }
  }
  return Value::integer(r ? 1 : 0);
}

Value int_pow(i128 base, i128 exp) {
  if (exp < 0) return Value::error("a negative integer power");
  i128 result = 1;
  while (exp > 0) {
    if (exp & 1) {
      if (__builtin_mul_overflow(result, base, &result)) return Value::error("an integer overflow");
    }
    exp >>= 1;
    if (exp > 0 && __builtin_mul_overflow(base, base, &base)) return Value::error("an integer overflow");
  }
  return Value::integer(result);
}

Value binary(Token::Op op, const Value& a, const Value& b) {
  if (a.kind == Value::Error) return a;
  if (b.kind == Value::Error) return b;
  if (op >= Token::Eq && op <= Token::Ge) return compare(op, a, b);
  bool ints = a.kind == Value::Int && b.kind == Value::Int;
  if (ints) {
    i128 x = a.i, y = b.i, r = 0;
    switch (op) {
      case Token::Add: if (__builtin_add_overflow(x, y, &r)) return Value::error("an integer overflow"); break;
      case Token::Sub: if (__builtin_sub_overflow(x, y, &r)) return Value::error("an integer overflow"); break;
      case Token::Mul: if (__builtin_mul_overflow(x, y, &r)) return Value::error("an integer overflow"); break;
      case Token::FloorDiv:
      case Token::Mod: {
        if (y == 0) return Value::error("division by zero");
        if (x == kMin && y == -1) return op == Token::Mod ? Value::integer(0) : Value::error("an integer overflow");
        i128 q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) { q -= 1; m += y; }
        r = op == Token::FloorDiv ? q : m;
        break;
      }
      case Token::Pow: return int_pow(x, y);
      case Token::BitOr: r = x | y; break;
      case Token::BitAnd: r = x & y; break;
      case Token::Shl:
        if (y < 0) return Value::error("a negative shift count");
        if (y > 127 || (x != 0 && (y >= 127 || (x << y) >> y != x))) return Value::error("an integer overflow");
        r = x << y;
        break;
      case Token::Shr:
        if (y < 0) return Value::error("a negative shift count");
        r = y > 127 ? (x < 0 ? -1 : 0) : x >> y;
        break;
      case Token::Div:
        if (y == 0) return Value::error("division by zero");
        return Value::real(static_cast<double>(static_cast<long double>(x) / static_cast<long double>(y)));
      default: return Value::error("an unknown operator");
    }
    return Value::integer(r);
  }
  double x = as_double(a), y = as_double(b);
  switch (op) {
    case Token::Add: return Value::real(x + y);
    case Token::Sub: return Value::real(x - y);
    case Token::Mul: return Value::real(x * y);
    case Token::Div:
      if (y == 0.0) return Value::error("division by zero");
      return Value::real(x / y);
    case Token::FloorDiv:
    case Token::Mod: {
      if (y == 0.0) return Value::error("division by zero");
      double q, m;
      float_divmod(x, y, &q, &m);
      return Value::real(op == Token::FloorDiv ? q : m);
    }
    case Token::Pow: {
      if (b.kind != Value::Int) return Value::error("a float power");
      double r = std::pow(x, static_cast<double>(b.i));
      if (!std::isfinite(r)) return Value::error("a float overflow");
      return Value::real(r);
    }
    default: return Value::error("a bitwise operator on a float");
  }
}

// triton.next_power_of_2: the smallest power of two >= v, 0 for v <= 0; past 2**126 the result
// does not fit (an overflow error, as Python's evaluator of the RPN gives beyond 127 bits).
Value next_pow2_of(const Value& v) {
  if (v.kind == Value::Error) return v;
  if (v.kind != Value::Int) return Value::error("next_pow2 of a float");
  if (v.i <= 0) return Value::integer(0);
  if (v.i > (i128(1) << 126)) return Value::error("an integer overflow");
  i128 r = 1;
  while (r < v.i) r <<= 1;
  return Value::integer(r);
}

Token::Op op_of(const std::string& name, bool* ok) {
  static const std::pair<const char*, Token::Op> table[] = {
      {"+", Token::Add}, {"-", Token::Sub}, {"*", Token::Mul}, {"//", Token::FloorDiv}, {"%", Token::Mod},
      {"**", Token::Pow}, {"|", Token::BitOr}, {"&", Token::BitAnd}, {"<<", Token::Shl}, {">>", Token::Shr},
      {"/", Token::Div}, {"==", Token::Eq}, {"!=", Token::Ne}, {"<", Token::Lt}, {"<=", Token::Le},
      {">", Token::Gt}, {">=", Token::Ge}};
  for (const auto& entry : table) {
    if (name == entry.first) { *ok = true; return entry.second; }
  }
  *ok = false;
  return Token::Add;
}

}  // namespace

Value apply_binary(Token::Op op, const Value& a, const Value& b) { return binary(op, a, b); }
Value apply_next_pow2(const Value& v) { return next_pow2_of(v); }

Program::Program(const Json& json, size_t n_inputs, const std::string& where) {
  const auto& list = as_array(json, where);
  if (list.size() > 65536) throw BundleError(where + " has more than 65536 tokens");
  size_t depth = 0;
  auto need = [&](size_t n) {
    if (depth < n) throw BundleError(where + " pops more values than it pushed");
  };
  for (size_t i = 0; i < list.size(); ++i) {
    std::string at = where + " token " + std::to_string(i);
    const auto& t = as_array(list[i], at);
    if (t.empty()) throw BundleError(at + " is empty");
    const std::string& tag = as_string(t[0], at);
    Token tok{};
    auto arg = [&](size_t k) -> int64_t {
      if (t.size() <= k) throw BundleError(at + " ('" + tag + "') lacks an operand");
      return as_int(t[k], at);
    };
    if (tag == "int") {
      if (t.size() != 2) throw BundleError(at + " is not [\"int\", TEXT]");
      tok.op = Token::Lit;
      tok.literal = Value::integer(parse_i128(as_string(t[1], at), at));
      need(0), ++depth;
    } else if (tag == "float") {
      if (t.size() != 2 || !t[1].is<double>()) throw BundleError(at + " is not [\"float\", NUMBER]");
      tok.op = Token::Lit;
      tok.literal = t[1].is<int64_t>() ? Value::real(static_cast<double>(t[1].get<int64_t>()))
                                       : Value::real(t[1].get<double>());
      ++depth;
    } else if (tag == "size" || tag == "stride" || tag == "arg") {
      int64_t index = arg(1);
      if (index < 0 || static_cast<size_t>(index) >= n_inputs)
        throw BundleError(at + ": input " + std::to_string(index) + " is out of range (the op has " +
                          std::to_string(n_inputs) + ")");
      tok.op = tag == "size" ? Token::Size : tag == "stride" ? Token::Stride : Token::Arg;
      tok.a = static_cast<int32_t>(index);
      if (tag != "arg") {
        int64_t dim = arg(2);
        if (dim < 0 || dim > 64) throw BundleError(at + ": dimension " + std::to_string(dim) + " is out of range");
        tok.b = static_cast<int32_t>(dim);
      }
      ++depth;
    } else if (tag == "op") {
      bool ok;
      tok.op = op_of(t.size() == 2 ? as_string(t[1], at) : std::string(), &ok);
      if (!ok) throw BundleError(at + " is not a known binary operator");
      need(2), --depth;
    } else if (tag == "unary") {
      const std::string& name = t.size() == 2 ? as_string(t[1], at) : tag;
      if (name == "neg") tok.op = Token::Neg;
      else if (name == "pos") tok.op = Token::Pos;
      else if (name == "not") tok.op = Token::Not;
      else throw BundleError(at + " is not a known unary operator");
      need(1);
    } else if (tag == "bool" || tag == "call") {
      const std::string& name = t.size() == 3 ? as_string(t[1], at) : tag;
      int64_t n = arg(2);
      if (tag == "bool" && name == "and") tok.op = Token::And;
      else if (tag == "bool" && name == "or") tok.op = Token::Or;
      else if (tag == "call" && name == "min") tok.op = Token::Min;
      else if (tag == "call" && name == "max") tok.op = Token::Max;
      else if (tag == "call" && name == "next_pow2") tok.op = Token::NextPow2;
      else throw BundleError(at + " is not and/or/min/max/next_pow2");
      if (n < 1 || n > 65536) throw BundleError(at + " has an operand count out of range");
      if (tok.op == Token::NextPow2 && n != 1) throw BundleError(at + ": next_pow2 takes 1 operand");
      need(static_cast<size_t>(n));
      depth -= static_cast<size_t>(n) - 1;
      tok.a = static_cast<int32_t>(n);
    } else {
      throw BundleError(at + ": '" + tag + "' is not one of int/float/size/arg/op/unary/bool/call/stride");
    }
    depth_ = std::max(depth_, depth);
    tokens_.push_back(tok);
  }
  if (depth != 1) throw BundleError(where + " leaves " + std::to_string(depth) + " values on the stack, not 1");
}

Value Program::run(const std::vector<Input>& inputs) const {
  // Small programs (nearly all) use the stack's inline storage: no allocation per call.
  Value inline_stack[32];
  std::vector<Value> heap;
  Value* stack = inline_stack;
  if (depth_ > 32) {
    heap.resize(depth_);
    stack = heap.data();
  }
  size_t sp = 0;
  for (const Token& t : tokens_) {
    switch (t.op) {
      case Token::Lit: stack[sp++] = t.literal; break;
      case Token::Size: {
        const Input& in = inputs[t.a];
        stack[sp++] = in.is_tensor && t.b < in.rank ? Value::integer(in.sizes[t.b])
                                                    : Value::error("an input has no such dimension");
        break;
      }
      case Token::Stride: {
        const Input& in = inputs[t.a];
        stack[sp++] = in.is_tensor && in.strides != nullptr && t.b < in.rank
                          ? Value::integer(in.strides[t.b])
                          : Value::error("an input has no such dimension");
        break;
      }
      case Token::Arg: stack[sp++] = inputs[t.a].scalar; break;
      case Token::Neg:
      case Token::Pos:
      case Token::Not: {
        Value& v = stack[sp - 1];
        if (v.kind == Value::Error) break;
        if (t.op == Token::Not) v = Value::integer(v.truthy() ? 0 : 1);
        else if (t.op == Token::Neg) {
          if (v.kind == Value::Float) v.f = -v.f;
          else if (v.i == kMin) v = Value::error("an integer overflow");
          else v.i = -v.i;
        }
        break;
      }
      case Token::And:
      case Token::Or: {
        // Python: the first operand that decides (falsy for and, truthy for or), else the last;
        // an error counts only if it is reached
        size_t base = sp - t.a;
        Value result = stack[sp - 1];
        for (size_t k = base; k + 1 < sp; ++k) {
          const Value& v = stack[k];
          if (v.kind == Value::Error || (t.op == Token::And ? !v.truthy() : v.truthy())) {
            result = v;
            break;
          }
        }
        sp = base;
        stack[sp++] = result;
        break;
      }
      case Token::Min:
      case Token::Max: {
        size_t base = sp - t.a;
        Value best = stack[base];
        for (size_t k = base; k < sp; ++k) {
          if (stack[k].kind == Value::Error) { best = stack[k]; break; }
          if (k > base && compare(t.op == Token::Min ? Token::Lt : Token::Gt, stack[k], best).i) best = stack[k];
        }
        sp = base;
        stack[sp++] = best;
        break;
      }
      case Token::NextPow2: stack[sp - 1] = next_pow2_of(stack[sp - 1]); break;
      default: {
        Value b = stack[--sp];
        stack[sp - 1] = binary(t.op, stack[sp - 1], b);
        break;
      }
    }
  }
  return stack[0];
}

std::string describe(const Value& v) {
  if (v.kind == Value::Error) return std::string("error: ") + v.why;
  if (v.kind == Value::Float) {
    Json j(v.f);
    return canonical_json(j);
  }
  i128 x = v.i;
  if (x == 0) return "0";
  bool negative = x < 0;
  std::string digits;
  while (x != 0) {
    int d = static_cast<int>(x % 10);
    digits += static_cast<char>('0' + (d < 0 ? -d : d));
    x /= 10;
  }
  if (negative) digits += '-';
  return std::string(digits.rbegin(), digits.rend());
}

bool to_int64(const Value& v, int64_t* out) {
  if (v.kind != Value::Int || v.i > std::numeric_limits<int64_t>::max() || v.i < std::numeric_limits<int64_t>::min())
    return false;
  *out = static_cast<int64_t>(v.i);
  return true;
}

}  // namespace kgrt
