"""Bundle expressions in the form the C++ runtime evaluates: postfix (RPN) token lists.

The manifest keeps every expression as Python text (``_expr``'s grammar, read by the Python
loader); manifest version 2 adds, beside it, the same expression compiled here at build time into
a list of tokens, so a process without Python evaluates it with a stack machine and no parser of
Python syntax. Each token is a small JSON array:

- ``["int", "123"]``: an integer literal (decimal text: JSON numbers lose precision past 2**53);
- ``["float", 1e-06]``: a float literal;
- ``["size", i, d]``: dimension ``d`` of input ``i`` (the op's parameters, in schema order);
- ``["stride", i, d]``: the stride (in elements) of input ``i`` along dimension ``d``, written
  ``x.stride(d)`` in the text: a kernel that takes strides gets the caller's. Older runtimes
  refuse the token when they load the bundle;
- ``["arg", i]``: the value of scalar input ``i``;
- ``["op", o]``: a binary operator, ``o`` one of ``BINARY`` (Python semantics: ``//`` and ``%``
  floor, ``/`` is true division, comparisons give 0/1);
- ``["unary", o]``: ``neg``, ``pos`` or ``not``;
- ``["bool", "and" | "or", n]``: Python's ``and``/``or`` of the top ``n`` values (an operand, not 0/1);
- ``["call", f, n]``: ``min`` or ``max`` of the top ``n`` values (the first extreme wins), or
  ``["call", "next_pow2", 1]``: Triton's ``next_power_of_2`` of the top value (0 for n <= 0; a
  float is an error; a result past the integer range is an error). Older runtimes refuse the
  token when they load the bundle, so a bundle that uses it needs a runtime that knows it.

Evaluation is total: a division by zero, an int out of range or a type error makes an *error*
value, which ``and``/``or`` drop when Python would not have evaluated that operand, so a program
fails exactly where the Python text raises. ``evaluate`` is the reference implementation; the C++
runtime uses 128-bit integers with checked overflow (Python's are unbounded up to ``_expr``'s cap,
so only values beyond 2**127 differ: an error in C++).

>>> rpn = compile_rpn("(x.shape[0] + 1023) // 1024", ["x"])
>>> rpn
[['size', 0, 0], ['int', '1023'], ['op', '+'], ['int', '1024'], ['op', '//']]
>>> import torch; evaluate(rpn, [torch.empty(3000)])
3
"""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from typing import Any

from ..errors import BundleError
from .bundle_spec import limit
from ..symbolic.expr import check_expr, next_pow2

__all__ = ["compile_rpn", "evaluate", "EvalError", "BINARY", "MAX_TOKENS", "INT_BITS"]

_BINOP_NAMES = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**",
                ast.BitOr: "|", ast.BitAnd: "&", ast.LShift: "<<", ast.RShift: ">>", ast.Div: "/"}
_CMP_NAMES = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
BINARY = (*_BINOP_NAMES.values(), *_CMP_NAMES.values())
# The bundle spec's bound on one program (runtime/csrc/bundle_spec.h), checked here at build time
# so a bundle never exceeds it.
MAX_TOKENS = limit("PROGRAM_TOKENS")
INT_BITS = 127  # signed 128-bit integers


def compile_rpn(text: str, names: Sequence[str]) -> list[list[Any]]:
    """The postfix token list of expression ``text`` over input ``names`` (BundleError outside the
    grammar, for a chained comparison, or past ``MAX_TOKENS``)."""
    tree = check_expr(text, names)
    index = {n: i for i, n in enumerate(names)}
    out: list[list[Any]] = []
    # An explicit stack: a deep expression must not hit Python's recursion limit.
    todo: list[tuple[ast.AST, bool]] = [(tree.body, False)]
    while todo:
        node, expanded = todo.pop()
        if isinstance(node, ast.Constant):
            value = node.value
            if type(value) is float:
                out.append(["float", value])
            else:
                value = int(value)
                if value.bit_length() > INT_BITS:
                    raise BundleError(f"bundle expression {text[:120]!r}: the literal {value} does not fit "
                                      f"{INT_BITS + 1}-bit integers")
                out.append(["int", str(value)])
        elif isinstance(node, ast.Name):
            if node.id not in index:
                raise BundleError(f"bundle expression {text[:120]!r}: {node.id} is not a scalar input")
            out.append(["arg", index[node.id]])
        elif isinstance(node, ast.Subscript):
            out.append(["size", index[node.value.value.id], int(node.slice.value)])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):  # x.stride(d) (checked)
            out.append(["stride", index[node.func.value.id], int(node.args[0].value)])
        elif expanded:
            out.append(_operator(node))
        else:
            todo.append((node, True))
            todo.extend((child, False) for child in reversed(_operands(node, text)))
        if len(out) > MAX_TOKENS:
            raise BundleError(f"bundle expression {text[:120]!r} compiles to more than {MAX_TOKENS} tokens")
    return out


def _operands(node: ast.AST, text: str) -> list[ast.AST]:
    if isinstance(node, ast.BinOp):
        return [node.left, node.right]
    if isinstance(node, ast.UnaryOp):
        return [node.operand]
    if isinstance(node, ast.Compare):
        if len(node.ops) != 1:
            raise BundleError(f"bundle expression {text[:120]!r} chains comparisons; write (a < b) and (b < c)")
        return [node.left, node.comparators[0]]
    if isinstance(node, ast.BoolOp):
        return list(node.values)
    if isinstance(node, ast.Call):
        if not node.args:
            raise BundleError(f"bundle expression {text[:120]!r} calls {node.func.id}() without arguments")
        return list(node.args)
    raise BundleError(f"bundle expression {text[:120]!r}: {type(node).__name__} has no postfix form")


def _operator(node: ast.AST) -> list[Any]:
    if isinstance(node, ast.BinOp):
        return ["op", _BINOP_NAMES[type(node.op)]]
    if isinstance(node, ast.UnaryOp):
        return ["unary", {ast.USub: "neg", ast.UAdd: "pos", ast.Not: "not"}[type(node.op)]]
    if isinstance(node, ast.Compare):
        return ["op", _CMP_NAMES[type(node.ops[0])]]
    if isinstance(node, ast.BoolOp):
        # a and b and c is (a and b) and c: the same value and the same short-circuit
        return ["bool", "and" if isinstance(node.op, ast.And) else "or", len(node.values)]
    return ["call", node.func.id, len(node.args)]


class EvalError(Exception):
    """What an RPN program evaluates to where the Python text raises."""


class _Err:
    """An error value on the stack (dropped by and/or when Python would not evaluate it)."""

    def __init__(self, why: str) -> None:
        self.why = why


def _int_ok(v: Any) -> Any:
    if isinstance(v, int) and v.bit_length() > INT_BITS:
        return _Err(f"integer {v} does not fit {INT_BITS + 1} bits")
    return v


def _binary(o: str, a: Any, b: Any) -> Any:
    if isinstance(a, _Err):
        return a
    if isinstance(b, _Err):
        return b
    try:
        if o in ("//", "%", "/") and b == 0:
            return _Err("division by zero")
        if o == "**" and isinstance(a, float) and isinstance(b, int) and abs(b) > 64:
            return _Err("power too large")
        value = {
            "+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "//": lambda: a // b,
            "%": lambda: a % b, "**": lambda: a ** b if b >= 0 or isinstance(a, float) else _Err("negative power"),
            "|": lambda: a | b, "&": lambda: a & b,
            "<<": lambda: (a << b) if 0 <= b <= INT_BITS else _Err("shift out of range"),
            ">>": lambda: (a >> b) if b >= 0 else _Err("negative shift"), "/": lambda: a / b,
            "==": lambda: int(a == b), "!=": lambda: int(a != b), "<": lambda: int(a < b),
            "<=": lambda: int(a <= b), ">": lambda: int(a > b), ">=": lambda: int(a >= b),
        }[o]()
    except (TypeError, ArithmeticError) as exc:  # float << int, float overflow
        return _Err(f"{type(exc).__name__}: {exc}")
    if isinstance(value, float) and not math.isfinite(value) and o in ("**", "/"):
        return _Err("float overflow")
    return _int_ok(value)


def _unary(o: str, a: Any) -> Any:
    if isinstance(a, _Err):
        return a
    if o == "not":
        return int(not a)
    return _int_ok(-a if o == "neg" else +a)


def _number(v: Any) -> Any:
    """Python's bools are ints here (True + 1 == 2); tensors' sizes and scalars are plain numbers."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return _int_ok(v)
    return _Err(f"a {type(v).__name__} value")


def evaluate(tokens: Sequence[Sequence[Any]], args: Sequence[Any]) -> Any:
    """The value of an RPN program for the op's inputs ``args`` (tensors and scalars in schema
    order); ``EvalError`` where the Python text would raise."""
    stack: list[Any] = []
    for token in tokens:
        tag = token[0]
        if tag == "int":
            stack.append(int(token[1]))
        elif tag == "float":
            stack.append(float(token[1]))
        elif tag == "size":
            t = args[token[1]]
            d = token[2]
            stack.append(int(t.shape[d]) if hasattr(t, "shape") and 0 <= d < t.dim() else
                         _Err(f"input {token[1]} has no dimension {d}"))
        elif tag == "stride":
            t = args[token[1]]
            d = token[2]
            stack.append(int(t.stride(d)) if hasattr(t, "stride") and 0 <= d < t.dim() else
                         _Err(f"input {token[1]} has no dimension {d}"))
        elif tag == "arg":
            stack.append(_number(args[token[1]]))
        elif tag == "op":
            b, a = stack.pop(), stack.pop()
            stack.append(_binary(token[1], a, b))
        elif tag == "unary":
            stack.append(_unary(token[1], stack.pop()))
        elif tag == "bool":
            values = stack[len(stack) - token[2]:]
            del stack[len(stack) - token[2]:]
            stack.append(_boolean(token[1], values))
        elif tag == "call":
            values = stack[len(stack) - token[2]:]
            del stack[len(stack) - token[2]:]
            if token[1] == "next_pow2":
                if len(values) != 1:
                    raise BundleError(f"bundle program token {token!r}: next_pow2 takes 1 operand")
                stack.append(_next_pow2(values[0]))
            else:
                stack.append(_extreme(token[1], values))
        else:
            raise BundleError(f"bundle program token {token!r} is not one of "
                             "int/float/size/arg/op/unary/bool/call/stride")
    if len(stack) != 1:
        raise BundleError(f"bundle program leaves {len(stack)} values on the stack, not 1")
    if isinstance(stack[0], _Err):
        raise EvalError(stack[0].why)
    return stack[0]


def _boolean(o: str, values: list[Any]) -> Any:
    """Python's ``and``/``or``: the first operand that decides, errors only where evaluated."""
    for v in values[:-1]:
        if isinstance(v, _Err):
            return v
        if (not v) if o == "and" else bool(v):
            return v
    return values[-1]


def _next_pow2(v: Any) -> Any:
    if isinstance(v, _Err):
        return v
    if isinstance(v, float):
        return _Err("next_pow2 of a float")
    return _int_ok(next_pow2(v))  # v fits INT_BITS, so the result fits _expr's bound


def _extreme(f: str, values: list[Any]) -> Any:
    best = values[0]
    for v in values:
        if isinstance(v, _Err):
            return v
    for v in values[1:]:
        try:
            if (v < best) if f == "min" else (v > best):
                best = v
        except TypeError as exc:
            return _Err(str(exc))
    return best
