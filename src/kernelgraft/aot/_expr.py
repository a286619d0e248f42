"""Launch parameters as expressions of the inputs: written from sympy at build time, read back
through a small whitelisted grammar at load time.

An expression is Python text over the op's parameter names (``x.shape[0]``, ``eps``) and the
outputs (``out0.shape[1]``), integer and float literals, ``+ - * // % ** | & << >>``,
comparisons, ``and``/``or``/``not`` and ``min``/``max``. Anything else is refused when the bundle is
built (the signature is then compiled for static shapes) and again, by an AST check, when it is
loaded, so a manifest never runs code.

>>> f = compile_exprs(["x", "n"], ["(x.shape[0] + 1023) // 1024", "n * 2"])
>>> import torch; f(torch.empty(3000), 5)
(3, 10)
"""

from __future__ import annotations

import ast
import keyword
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._errors import BundleError

__all__ = ["Unsupported", "to_text", "compile_exprs", "check_expr"]


class Unsupported(Exception):
    """A sympy expression outside the grammar (the caller falls back to static shapes)."""


_REL = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def to_text(expr: Any, names: Mapping[Any, str]) -> str:
    """Python text for a sympy expression (or a plain number); symbols renamed through ``names``."""
    import sympy

    if isinstance(expr, bool):
        return "True" if expr else "False"
    if isinstance(expr, (int, float)):
        return repr(expr)
    if expr is sympy.true or expr is sympy.false:
        return "True" if expr is sympy.true else "False"
    if isinstance(expr, sympy.Symbol):
        try:
            return names[expr]
        except KeyError:
            raise Unsupported(f"symbol {expr} is not a size of an input") from None
    if isinstance(expr, sympy.Integer):
        return str(int(expr))
    if isinstance(expr, sympy.Float):
        return repr(float(expr))
    args = [to_text(a, names) for a in expr.args]
    cls = type(expr).__name__
    if isinstance(expr, sympy.Add):
        return "(" + " + ".join(args) + ")"
    if isinstance(expr, sympy.Mul):
        return "(" + " * ".join(args) + ")"
    if isinstance(expr, sympy.Pow):
        if not (expr.exp.is_Integer and int(expr.exp) >= 0):
            raise Unsupported(f"power {expr}")
        return f"({args[0]} ** {args[1]})"
    if isinstance(expr, sympy.core.relational.Relational) and expr.rel_op in _REL:
        return f"({args[0]} {_REL[expr.rel_op]} {args[1]})"
    if isinstance(expr, sympy.And):
        return "(" + " and ".join(args) + ")"
    if isinstance(expr, sympy.Or):
        return "(" + " or ".join(args) + ")"
    if isinstance(expr, sympy.Not):
        return f"(not {args[0]})"
    binary = {
        "FloorDiv": "//", "PythonMod": "%", "Mod": "%", "BitwiseFn_bitwise_or": "|",
        "BitwiseFn_bitwise_and": "&", "LShift": "<<", "RShift": ">>",
    }
    if cls in binary and len(args) == 2:
        return f"({args[0]} {binary[cls]} {args[1]})"
    if cls == "CeilDiv" and len(args) == 2:
        return f"(-((-{args[0]}) // {args[1]}))"
    if cls in ("Max", "Min"):
        return f"{cls.lower()}({', '.join(args)})"
    raise Unsupported(f"{cls} in {expr}")


_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.Pow, ast.BitOr, ast.BitAnd,
           ast.LShift, ast.RShift, ast.Div)
_CMPOPS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_FUNCS = {"min": min, "max": max}


def check_expr(text: str, names: Sequence[str]) -> ast.Expression:
    """Parse ``text`` and refuse anything outside the grammar (BundleError)."""
    if not isinstance(text, str):
        raise BundleError(f"bundle expression must be a string, got {type(text).__name__}")
    if len(text) > 200_000:
        raise BundleError(f"bundle expression {text[:80]!r}... is longer than 200000 characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:  # nesting too deep, NUL
        raise BundleError(f"bundle expression {text[:80]!r} does not parse: "
                          f"{type(exc).__name__}: {exc}") from None
    allowed = set(names)
    for node in ast.walk(tree):
        ok = isinstance(node, (ast.Expression, ast.Load, ast.Tuple, ast.BoolOp, ast.And, ast.Or,
                               ast.Not, ast.USub, ast.UAdd, ast.Compare, *_BINOPS, *_CMPOPS))
        if isinstance(node, ast.BinOp):
            ok = isinstance(node.op, _BINOPS)
            # '**' and '<<' only by a small literal: '9**9**9' in a manifest would hang the loader
            if ok and isinstance(node.op, (ast.Pow, ast.LShift)):
                right = node.right
                ok = (isinstance(right, ast.Constant) and type(right.value) is int
                      and 0 <= right.value <= 64)
        elif isinstance(node, ast.UnaryOp):
            ok = isinstance(node.op, (ast.USub, ast.UAdd, ast.Not))
        elif isinstance(node, ast.Constant):
            ok = type(node.value) in (int, float, bool)
        elif isinstance(node, ast.Name):
            ok = node.id in allowed or node.id in _FUNCS
        elif isinstance(node, ast.Call):
            ok = isinstance(node.func, ast.Name) and node.func.id in _FUNCS and not node.keywords
        elif isinstance(node, ast.Attribute):
            ok = node.attr == "shape" and isinstance(node.value, ast.Name) and node.value.id in allowed
        elif isinstance(node, ast.Subscript):
            ok = (isinstance(node.value, ast.Attribute) and isinstance(node.slice, ast.Constant)
                  and type(node.slice.value) is int)
        if not ok:
            raise BundleError(
                f"bundle expression {text[:120]!r} uses {type(node).__name__}, which the manifest "
                "grammar does not allow (sizes, scalars, arithmetic, comparisons, min/max only)"
            )
    return tree


def compile_exprs(names: Sequence[str], exprs: Sequence[str]) -> Callable[..., tuple]:
    """One function ``f(*values_for_names) -> tuple`` evaluating every expression."""
    for n in names:
        if not isinstance(n, str) or not n.isidentifier() or keyword.iskeyword(n) or n in _FUNCS:
            raise BundleError(f"bundle parameter name {n!r} is not a plain identifier")
    if len(set(names)) != len(names):
        raise BundleError(f"bundle parameter names {list(names)} repeat a name")
    for text in exprs:
        check_expr(text, names)
    body = "(" + "".join(f"{e}, " for e in exprs) + ")"
    source = f"lambda {', '.join(names)}: {body}"
    check_expr(source.split(": ", 1)[1], names)
    try:
        code = compile(source, "<kernelgraft bundle>", "eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise BundleError(f"bundle expressions {body[:120]!r} do not compile: "
                          f"{type(exc).__name__}: {exc}") from None
    return eval(code, {"__builtins__": {}, **_FUNCS})  # noqa: S307
