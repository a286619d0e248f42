"""Launch parameters as expressions of the inputs: written from sympy at build time, read back
through a small whitelisted grammar at load time.

An expression is Python text over the op's parameter names (``x.shape[0]``, ``x.stride(1)``,
``eps``) and the outputs (``out0.shape[1]``), integer and float literals, ``+ - * // % ** | & << >>``,
comparisons, ``and``/``or``/``not``, ``min``/``max`` and ``next_pow2`` (Triton's
``next_power_of_2``, written as one call by the tracer: ``_pow2``). Anything else is refused when the bundle is
built (the signature is then compiled for static shapes) and again, by an AST check, when it is
loaded, so a manifest never runs code.

>>> f = compile_exprs(["x", "n"], ["(x.shape[0] + 1023) // 1024", "n * 2"])
>>> import torch; f(torch.empty(3000), 5)
(3, 10)
"""

from __future__ import annotations

import ast
import functools
import keyword
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import BundleError

__all__ = ["Unsupported", "to_text", "compile_exprs", "check_expr", "constant_value", "next_pow2",
           "reads_strides", "MAX_DIM"]


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


# Evaluation is bounded: '**', '*', '<<' and next_pow2 refuse int results over _MAX_BITS bits (see below).
_MAX_BITS = 4096
_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.Pow, ast.BitOr, ast.BitAnd,
           ast.LShift, ast.RShift, ast.Div)
_CMPOPS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def next_pow2(n: int) -> int:
    """``triton.next_power_of_2``: the smallest power of two >= n, and 0 for n <= 0 (Triton's
    ``n - 1`` then ``+ 1`` give 0 at 0; its bit-smearing agrees with this for -2**62 <= n <= 2**64,
    far past any size). Raises TypeError for a float (Triton's ``>>`` does) and OverflowError past
    the evaluator's bound (``_MAX_BITS``)."""
    if isinstance(n, bool):
        n = int(n)
    if not isinstance(n, int):
        raise TypeError(f"next_pow2() takes an int, got {type(n).__name__} {n!r}")
    if n <= 0:
        return 0
    bits = (n - 1).bit_length()
    if bits >= _MAX_BITS:
        raise OverflowError(f"next_pow2({n}) exceeds {_MAX_BITS} bits")
    return 1 << bits


_FUNCS = {"min": min, "max": max, "next_pow2": next_pow2}
MAX_DIM = 64  # the largest dimension index a size or stride term may name (the C++ runtime's bound)
_ARITY = {"next_pow2": 1}  # min/max take any count (one is an error when evaluated, as in Python)


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
    # min/max/next_pow2 only as the function of a call: a bare 'min' would evaluate to a function;
    # 'x.stride' likewise only as the function of 'x.stride(d)'
    callees = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
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
            ok = node.id in allowed or (node.id in _FUNCS and id(node) in callees)
        elif isinstance(node, ast.Call):
            ok = (isinstance(node.func, ast.Name) and node.func.id in _FUNCS and not node.keywords
                  and _ARITY.get(node.func.id, len(node.args)) == len(node.args)) or _is_stride(node)
        elif isinstance(node, ast.Attribute):
            ok = isinstance(node.value, ast.Name) and node.value.id in allowed and (
                node.attr == "shape" or (node.attr == "stride" and id(node) in callees))
        elif isinstance(node, ast.Subscript):
            ok = (isinstance(node.value, ast.Attribute) and isinstance(node.slice, ast.Constant)
                  and type(node.slice.value) is int)
        if not ok:
            raise BundleError(
                f"bundle expression {text[:120]!r} uses {type(node).__name__}, which the manifest "
                "grammar does not allow (sizes, strides, scalars, arithmetic, comparisons, "
                "min/max/next_pow2 only)"
            )
    return tree


def _is_stride(node: ast.AST) -> bool:
    """``x.stride(d)``: a tensor's stride (in elements) along dimension ``d``, a literal 0..MAX_DIM."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "stride"
            and isinstance(node.func.value, ast.Name) and not node.keywords and len(node.args) == 1
            and isinstance(node.args[0], ast.Constant) and type(node.args[0].value) is int
            and 0 <= node.args[0].value <= MAX_DIM)


def reads_strides(text: str) -> bool:
    """Whether a (checked) expression reads a stride: its value then depends on the layout of
    the call's tensors, not on their sizes alone."""
    return any(_is_stride(node) for node in ast.walk(ast.parse(text, mode="eval")))


# Evaluation is bounded: '**', '*' and '<<' refuse int results over _MAX_BITS bits (a tower such as
# ((9 ** 64) ** 64) ** 64 would otherwise compute for minutes) and a zero divisor is an error that
# names the expression. A size expression never needs more than a few hundred bits.
_DIVS = (ast.FloorDiv, ast.Mod, ast.Div)


class _Limit(Exception):
    def __init__(self, site: int, why: str) -> None:
        super().__init__(why)
        self.site = site


def _int_operands(a: Any, b: Any) -> bool:
    return isinstance(a, int) and isinstance(b, int)


def _mul(a: Any, b: Any, site: int) -> Any:
    if _int_operands(a, b) and a.bit_length() + b.bit_length() > _MAX_BITS:
        raise _Limit(site, f"the product exceeds {_MAX_BITS} bits")
    return a * b


def _pow(a: Any, b: Any, site: int) -> Any:
    if _int_operands(a, b) and a.bit_length() * b > _MAX_BITS:
        raise _Limit(site, f"the power exceeds {_MAX_BITS} bits")
    return a ** b


def _lshift(a: Any, b: Any, site: int) -> Any:
    if _int_operands(a, b) and a.bit_length() + b > _MAX_BITS:
        raise _Limit(site, f"the shift exceeds {_MAX_BITS} bits")
    return a << b


def _divider(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any, int], Any]:
    def divide(a: Any, b: Any, site: int) -> Any:
        if b == 0:
            raise _Limit(site, "it divides by zero")
        return op(a, b)

    return divide


_HELPERS = {ast.Mult: "_kg_mul", ast.Pow: "_kg_pow", ast.LShift: "_kg_lshift", ast.FloorDiv: "_kg_floordiv",
            ast.Mod: "_kg_mod", ast.Div: "_kg_div"}
_SAFE = {"_kg_mul": _mul, "_kg_pow": _pow, "_kg_lshift": _lshift,
         "_kg_floordiv": _divider(lambda a, b: a // b), "_kg_mod": _divider(lambda a, b: a % b),
         "_kg_div": _divider(lambda a, b: a / b)}


class _Source:
    """Source segments of nodes (``ast.get_source_segment`` re-splits the text on every call)."""

    def __init__(self, text: str) -> None:
        self.lines = [line.encode() for line in text.splitlines(keepends=True)] or [b""]

    def segment(self, node: ast.AST, limit: int = 120) -> str:
        first, last = node.lineno - 1, node.end_lineno - 1
        if first == last:
            data = self.lines[first][node.col_offset:node.end_col_offset]
        else:
            data = b"".join([self.lines[first][node.col_offset:], *self.lines[first + 1:last],
                             self.lines[last][:node.end_col_offset]])
        return data.decode(errors="replace")[:limit] if limit else data.decode()


class _Bound(ast.NodeTransformer):
    """Routes every operator that can grow or divide through the checked helpers above."""

    def __init__(self, source: str, sites: list[str]) -> None:
        self.source = _Source(source)
        self.sites = sites

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        helper = _HELPERS.get(type(node.op))
        if helper is None:
            return node
        self.sites.append(self.source.segment(node))
        call = ast.Call(func=ast.Name(helper, ast.Load()),
                        args=[node.left, node.right, ast.Constant(len(self.sites) - 1)], keywords=[])
        return ast.copy_location(call, node)


def _has_names(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id not in _FUNCS for n in ast.walk(node))


def _named(tree: ast.AST) -> set[int]:
    """ids of the nodes that read a name; one pass (children come after parents in ast.walk)."""
    out: set[int] = set()
    for node in reversed(list(ast.walk(tree))):
        if (isinstance(node, ast.Name) and node.id not in _FUNCS) or any(
                id(c) in out for c in ast.iter_child_nodes(node)):
            out.add(id(node))
    return out


def _check_constants(text: str, tree: ast.Expression) -> None:
    """Load-time domain check: every constant part is evaluated now (bounded), and a divisor that
    is a constant zero is refused, so these faults are a ``BundleError`` when the bundle loads."""
    named = _named(tree)
    source = _Source(text)

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant):  # -1: no compile
            return {ast.USub: lambda v: -v, ast.UAdd: lambda v: +v, ast.Not: lambda v: not v}[
                type(node.op)](node.operand.value)
        return _compile([], [source.segment(node, limit=0)], when="")()[0]  # bounded: may raise

    if id(tree.body) not in named:
        value(tree.body)
        return
    for node in ast.walk(tree):
        if id(node) not in named:
            continue
        for child in ast.iter_child_nodes(node):
            if isinstance(node, ast.Call) and child is node.func:
                continue  # min/max/next_pow2 itself: a function, not a value
            if id(child) not in named and not isinstance(child, (ast.Constant, ast.expr_context, ast.operator,
                                                                   ast.cmpop, ast.boolop, ast.unaryop)):
                value(child)
        if isinstance(node, ast.BinOp) and isinstance(node.op, _DIVS) and id(node.right) not in named:
            if value(node.right) == 0:
                raise BundleError(f"bundle expression {text[:120]!r} divides by zero "
                                  f"({source.segment(node, limit=80)})")


def constant_value(text: str, names: Sequence[str]) -> Any:
    """The value of an expression that reads none of ``names`` (a grid of ``"1"``), or None when it does."""
    tree = check_expr(text, names)
    if isinstance(tree.body, ast.Constant):
        return tree.body.value
    return _compile([], [text], [tree], when="")()[0] if id(tree.body) not in _named(tree) else None


def compile_exprs(names: Sequence[str], exprs: Sequence[str]) -> Callable[..., tuple]:
    """One function ``f(*values_for_names) -> tuple`` evaluating every expression.

    Constant parts are evaluated here (a constant zero divisor or an oversized constant is a
    ``BundleError`` now); at call time an expression that divides by zero or grows past
    ``_MAX_BITS`` bits raises ``BundleError`` naming the sub-expression. The kernels of a bundle
    repeat the same expressions many times (every config of a candidate has the same guards, grid
    and output shapes; bundles built before ``next_pow2`` hold Triton's expansion of
    ``next_power_of_2``, kilobytes long, in many guards), so each
    expression is checked and compiled once per parameter names and kept (``_one``): a bundle of a
    hundred kernels loads in a fraction of the time."""
    for n in names:
        if not isinstance(n, str) or not n.isidentifier() or keyword.iskeyword(n) or n in _FUNCS:
            raise BundleError(f"bundle parameter name {n!r} is not a plain identifier")
    if len(set(names)) != len(names):
        raise BundleError(f"bundle parameter names {list(names)} repeat a name")
    key = tuple(names)
    fns = [_one(key, text) if isinstance(text, str) else _one.__wrapped__(key, text) for text in exprs]
    if len(fns) == 1:
        return fns[0]

    def evaluate(*values: Any) -> tuple:
        return tuple(f(*values)[0] for f in fns)

    return evaluate


@functools.lru_cache(maxsize=8192)
def _one(names: tuple, text: str) -> Callable[..., tuple]:
    """One checked expression compiled; kept per (names, text): a pure function of both."""
    tree = check_expr(text, names)
    _check_constants(text, tree)
    return _compile(names, [text], [tree])


def _compile(names: Sequence[str], exprs: Sequence[str], trees: Sequence[ast.Expression] | None = None,
             when: str = " for these inputs") -> Callable[..., tuple]:
    """The checked expressions as one function; ``trees`` (their parses) are consumed."""
    if trees is None:
        trees = [check_expr(text, names) for text in exprs]
    sites: list[str] = []
    body = ", ".join(exprs)
    try:
        elts = [_Bound(text, sites).visit(tree).body for text, tree in zip(exprs, trees)]
        args = ast.arguments(posonlyargs=[], args=[ast.arg(n) for n in names], vararg=None, kwonlyargs=[],
                             kw_defaults=[], kwarg=None, defaults=[])
        tree = ast.Expression(ast.Lambda(args, ast.Tuple(elts, ast.Load())))
        code = compile(ast.fix_missing_locations(tree), "<kernelgraft bundle>", "eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise BundleError(f"bundle expressions {body[:120]!r} do not compile: "
                          f"{type(exc).__name__}: {exc}") from None
    fn = eval(code, {"__builtins__": {}, **_FUNCS, **_SAFE})  # noqa: S307

    def evaluate(*values: Any) -> tuple:
        try:
            return fn(*values)
        except _Limit as exc:
            raise BundleError(f"bundle expression {sites[exc.site]!r}: {exc}{when}") from None
        except (ArithmeticError, AttributeError, IndexError, TypeError, ValueError) as exc:  # a scalar's .shape
            raise BundleError(f"bundle expressions {body[:120]!r} cannot be evaluated{when}: "
                              f"{type(exc).__name__}: {exc}") from None

    return evaluate
