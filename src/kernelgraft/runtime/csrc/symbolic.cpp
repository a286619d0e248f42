#include "symbolic.h"

#include <limits>

namespace kgrt {
namespace {

SymValue concrete(Value v) {
  SymValue s;
  s.value = v;
  return s;
}

SymValue of_int(c10::SymInt i) {
  if (auto c = i.maybe_as_int()) return concrete(Value::integer(*c));
  SymValue s;
  s.kind = SymValue::Int;
  s.i = std::move(i);
  return s;
}

SymValue of_bool(c10::SymBool b) {
  if (auto c = b.maybe_as_bool()) return concrete(Value::integer(*c ? 1 : 0));
  SymValue s;
  s.kind = SymValue::Bool;
  s.b = std::move(b);
  return s;
}

// The value with its symbols replaced by their concrete values (the ShapeEnv records the guard).
Value concretize(const SymValue& s, Freedom freedom) {
  if (s.kind != SymValue::Concrete && freedom != Freedom::Specialize) throw Undecided();
  if (s.kind == SymValue::Int) return Value::integer(s.i.guard_int(__FILE__, __LINE__));
  if (s.kind == SymValue::Bool) return Value::integer(s.b.guard_bool(__FILE__, __LINE__) ? 1 : 0);
  return s.value;
}

// An integer operand as a SymInt; false for floats, errors, symbolic bools and ints past int64.
bool as_symint(const SymValue& s, c10::SymInt* out) {
  if (s.kind == SymValue::Int) {
    *out = s.i;
    return true;
  }
  int64_t x;
  if (s.kind != SymValue::Concrete || !to_int64(s.value, &x)) return false;
  *out = c10::SymInt(x);
  return true;
}

bool is_error(const SymValue& s) { return s.kind == SymValue::Concrete && s.value.kind == Value::Error; }

// Python's truth of the value; a symbolic one asks the ShapeEnv: what it knows already (Static),
// or a guard on the answer.
bool truth(const SymValue& s, Freedom freedom) {
  if (s.kind == SymValue::Concrete) return s.value.truthy();
  c10::SymBool b = s.kind == SymValue::Bool ? s.b : s.i.sym_ne(c10::SymInt(0));
  if (freedom != Freedom::Static) return b.guard_bool(__FILE__, __LINE__);
  if (b.statically_known_true(__FILE__, __LINE__)) return true;
  if (b.sym_not().statically_known_true(__FILE__, __LINE__)) return false;
  throw Undecided();
}

SymValue binary_symbolic(Token::Op op, const SymValue& a, const SymValue& b, Freedom freedom) {
  if (is_error(a)) return a;
  if (is_error(b)) return b;
  if (a.kind == SymValue::Concrete && b.kind == SymValue::Concrete) return concrete(apply_binary(op, a.value, b.value));
  c10::SymInt x, y;
  bool ints = as_symint(a, &x) && as_symint(b, &y);
  if (ints) {
    switch (op) {
      case Token::Add: return of_int(x + y);
      case Token::Sub: return of_int(x - y);
      case Token::Mul: return of_int(x * y);
      case Token::FloorDiv:
      case Token::Mod:
        if (auto d = y.maybe_as_int(); d.has_value() && *d == 0) return concrete(Value::error("division by zero"));
        // SymInt's / and % of symbols are SymNode's floordiv and mod: Python's, not C++'s truncation
        return of_int(op == Token::FloorDiv ? x / y : x % y);
      case Token::Eq: return of_bool(x.sym_eq(y));
      case Token::Ne: return of_bool(x.sym_ne(y));
      case Token::Lt: return of_bool(x.sym_lt(y));
      case Token::Le: return of_bool(x.sym_le(y));
      case Token::Gt: return of_bool(x.sym_gt(y));
      case Token::Ge: return of_bool(x.sym_ge(y));
      default: break;  // ** / and the bitwise operators: on concrete values below
    }
  }
  return concrete(apply_binary(op, concretize(a, freedom), concretize(b, freedom)));
}

// SymInt has no next-power-of-two, so a symbolic operand needs a value: the earlier passes leave
// the rule Undecided (another rule may hold without it); under Freedom::Specialize a binary search
// over the power-of-two buckets guards the size into one, (2**(k-1), 2**k], and the result is 2**k:
// the size stays symbolic within that range (a recompile when it leaves it), not fixed to one value.
SymValue next_pow2_symbolic(const SymValue& v, Freedom freedom) {
  if (v.kind != SymValue::Int || freedom != Freedom::Specialize)
    return concrete(apply_next_pow2(concretize(v, freedom)));
  const c10::SymInt& s = v.i;
  constexpr int kTop = 62;
  if (s.sym_le(c10::SymInt(0)).guard_bool(__FILE__, __LINE__)) return concrete(Value::integer(0));
  if (!s.sym_le(c10::SymInt(int64_t(1) << kTop)).guard_bool(__FILE__, __LINE__))
    return concrete(apply_next_pow2(concretize(v, freedom)));  // past 2**62: the value itself
  int lo = 0, hi = kTop;  // the answer's exponent is in [lo, hi]
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (s.sym_le(c10::SymInt(int64_t(1) << mid)).guard_bool(__FILE__, __LINE__)) hi = mid;
    else lo = mid + 1;
  }
  return concrete(Value::integer(i128(1) << lo));
}

}  // namespace

SymValue run_symbolic(const Program& program, const std::vector<SymInput>& inputs, Freedom freedom) {
  std::vector<SymValue> stack;
  stack.reserve(16);
  for (const Token& t : program.tokens()) {
    switch (t.op) {
      case Token::Lit: stack.push_back(concrete(t.literal)); break;
      case Token::Size: {
        const SymInput& in = inputs[t.a];
        stack.push_back(in.is_tensor && static_cast<size_t>(t.b) < in.sizes.size()
                            ? of_int(in.sizes[t.b])
                            : concrete(Value::error("an input has no such dimension")));
        break;
      }
      case Token::Stride: {
        const SymInput& in = inputs[t.a];
        stack.push_back(in.is_tensor && static_cast<size_t>(t.b) < in.strides.size()
                            ? of_int(in.strides[t.b])
                            : concrete(Value::error("an input has no such dimension")));
        break;
      }
      case Token::Arg: stack.push_back(concrete(inputs[t.a].scalar)); break;
      case Token::Pos: break;
      case Token::Neg:
      case Token::Not: {
        SymValue& v = stack.back();
        if (v.kind == SymValue::Concrete) {
          Value c = v.value;
          if (c.kind == Value::Error) break;
          // -x as 0 - x and not x as x == 0 reuse Program's checked arithmetic
          v = concrete(t.op == Token::Neg
                           ? (c.kind == Value::Float ? Value::real(-c.f) : apply_binary(Token::Sub, Value::integer(0), c))
                           : Value::integer(c.truthy() ? 0 : 1));
        } else if (v.kind == SymValue::Int) {
          v = t.op == Token::Neg ? of_int(-v.i) : of_bool(v.i.sym_eq(c10::SymInt(0)));
        } else {
          v = t.op == Token::Neg ? concrete(Value::integer(truth(v, freedom) ? -1 : 0))
                                 : of_bool(v.b.sym_not());
        }
        break;
      }
      case Token::And:
      case Token::Or: {
        // Python: the first operand that decides (falsy for and, truthy for or), else the last;
        // only the operands reached are asked for their truth (and guarded on)
        size_t base = stack.size() - t.a;
        SymValue result = stack.back();
        for (size_t k = base; k + 1 < stack.size(); ++k) {
          const SymValue& v = stack[k];
          if (is_error(v) || (t.op == Token::And ? !truth(v, freedom) : truth(v, freedom))) {
            result = v;
            break;
          }
        }
        stack.resize(base);
        stack.push_back(std::move(result));
        break;
      }
      case Token::Min:
      case Token::Max: {
        size_t base = stack.size() - t.a;
        SymValue best = stack[base];
        for (size_t k = base + 1; k < stack.size() && !is_error(best); ++k) {
          const SymValue& v = stack[k];
          c10::SymInt x, y;
          if (is_error(v)) {
            best = v;
          } else if (as_symint(best, &x) && as_symint(v, &y)) {
            best = of_int(t.op == Token::Min ? x.min(y) : x.max(y));
          } else {  // a float among them: Python compares the values
            Value cb = concretize(best, freedom), cv = concretize(v, freedom);
            bool better = apply_binary(t.op == Token::Min ? Token::Lt : Token::Gt, cv, cb).truthy();
            best = concrete(better ? cv : cb);
          }
        }
        stack.resize(base);
        stack.push_back(std::move(best));
        break;
      }
      case Token::NextPow2: {
        SymValue& v = stack.back();
        if (!is_error(v)) v = next_pow2_symbolic(v, freedom);
        break;
      }
      default: {
        SymValue b = std::move(stack.back());
        stack.pop_back();
        stack.back() = binary_symbolic(t.op, stack.back(), b, freedom);
        break;
      }
    }
  }
  return stack.empty() ? concrete(Value::error("an empty program")) : stack[0];
}

namespace {

// The rule's output shapes if its guards hold, false if one does not; Undecided past `freedom`.
bool rule_shapes(const MetaRule& rule, const std::vector<SymInput>& inputs, Freedom freedom,
                 std::vector<std::vector<c10::SymInt>>* shapes) {
  for (const auto& guard : rule.guards) {  // in order, up to the first that fails: as `and` would
    SymValue g = run_symbolic(guard, inputs, freedom);
    if (is_error(g) || !truth(g, freedom)) return false;
  }
  shapes->clear();
  for (const auto& shape : rule.shapes) {
    std::vector<c10::SymInt> dims;
    for (const auto& p : shape) {
      SymValue v = run_symbolic(p, inputs, freedom);
      c10::SymInt d;
      if (v.kind == SymValue::Bool || !as_symint(v, &d) || (v.kind == SymValue::Concrete && v.value.i < 0))
        return false;
      dims.push_back(std::move(d));
    }
    shapes->push_back(std::move(dims));
  }
  return true;
}

}  // namespace

bool meta_shapes(const OpEntry& op, const std::vector<ArgView>& args, const std::vector<SymInput>& inputs,
                 std::vector<std::vector<c10::SymInt>>* shapes, std::vector<std::string>* dtypes, std::string* why) {
  // Concrete sizes decide every rule in the first pass; the later ones are for symbolic sizes.
  for (Freedom freedom : {Freedom::Static, Freedom::Guard, Freedom::Specialize}) {
    for (const auto& rule : op.meta) {
      if (!typed_fit(rule.dtypes, rule.ranks, args) || !pins_hold(rule.pinned, args)) continue;
      try {
        if (!rule_shapes(rule, inputs, freedom, shapes)) continue;
      } catch (const Undecided&) {
        continue;
      }
      *dtypes = rule.out_dtypes;
      return true;
    }
  }
  *why = op.qualified + ": no output rule of the bundle holds for these inputs (" + describe_args(op, args) +
         "), so its output shapes are unknown; no bundled kernel could run them either";
  return false;
}

}  // namespace kgrt
