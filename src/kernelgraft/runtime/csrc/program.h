// The RPN programs of a manifest (kernelgraft/aot/rpn.py documents the tokens): decoded once
// when the bundle loads, evaluated per call with a small stack of 128-bit checked integers and
// doubles. Evaluation never throws: a division by zero, an overflow or a type mismatch is an
// error value, which Python's and/or drop exactly where Python would not evaluate the operand.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "json.h"

namespace kgrt {

using i128 = __int128;

struct Value {
  enum Kind : uint8_t { Int, Float, Error } kind = Int;
  i128 i = 0;
  double f = 0.0;
  const char* why = nullptr;  // Error: a static description

  static Value integer(i128 v) { Value x; x.i = v; return x; }
  static Value real(double v) { Value x; x.kind = Float; x.f = v; return x; }
  static Value error(const char* w) { Value x; x.kind = Error; x.why = w; return x; }
  bool truthy() const { return kind == Int ? i != 0 : f != 0.0; }
};

// One op input as programs see it: a tensor's sizes and strides, or a scalar's value.
struct Input {
  bool is_tensor = false;
  const int64_t* sizes = nullptr;
  const int64_t* strides = nullptr;  // null: not known (a Stride token is then an error value)
  int64_t rank = 0;
  Value scalar = Value::error("the input is None or not a number");
};

struct Token {
  enum Op : uint8_t {
    Lit, Size, Arg, Add, Sub, Mul, FloorDiv, Mod, Pow, BitOr, BitAnd, Shl, Shr, Div,
    Eq, Ne, Lt, Le, Gt, Ge, Neg, Pos, Not, And, Or, Min, Max, NextPow2, Stride
  } op;
  Value literal;   // Lit
  int32_t a = 0;   // Size/Stride/Arg: input index; And/Or/Min/Max: operand count
  int32_t b = 0;   // Size/Stride: dimension
};

class Program {
 public:
  Program() = default;
  // Decodes `tokens` (a JSON list) over `n_inputs` inputs; BundleError naming `where` if malformed
  // (an unknown token, an input index out of range, a stack that does not end with one value).
  Program(const Json& tokens, size_t n_inputs, const std::string& where);
  Value run(const std::vector<Input>& inputs) const;
  bool empty() const { return tokens_.empty(); }
  const std::vector<Token>& tokens() const { return tokens_; }  // for symbolic.cpp's interpreter

 private:
  std::vector<Token> tokens_;
  size_t depth_ = 0;  // the most values on the stack
};

// A binary operator (Add ... Ge) on two values, as Python computes it (errors propagate).
Value apply_binary(Token::Op op, const Value& a, const Value& b);
// triton.next_power_of_2 with the checks of a NextPow2 token (symbolic.cpp applies it to concrete values).
Value apply_next_pow2(const Value& v);

// "5", "1e-06", "error: division by zero": what tests compare with Python's values.
std::string describe(const Value& v);
// The value as an int64 (what a grid, a size or an integer parameter must be), or false.
bool to_int64(const Value& v, int64_t* out);

}  // namespace kgrt
