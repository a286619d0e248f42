"""The walker of the bundle spec's Python check (``_bundle_check`` walks a manifest with it): typed
access that fails naming the field's path, the caps on expression text and program tokens, and the
check of one RPN program (its token grammar, its stack, its constant parts evaluated as
``_rpn.evaluate`` does). The C++ runtime's ``spec_walk.cpp`` is the same in C++.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import BundleError
from .bundle_spec import kind_of, limit, table
from .rpn import BINARY, EvalError, compile_rpn, evaluate

__all__ = ["Walk"]

_DECIMAL = re.compile(r"-?[0-9]+\Z")
_I128 = (-(2**127), 2**127 - 1)


class Walk:
    def __init__(self, where: str, manifest: dict, texts: bool) -> None:
        self.where = where
        self.check_texts = texts
        self.version = manifest.get("version")
        self.programs = table().versions.get(self.version, False)
        self.texts: dict[str, None] = {}
        self.expr_chars = 0
        self.tokens = 0

    def fail(self, path: str, what: str) -> None:
        raise BundleError(f"{self.where}: {path}: {what}")

    # --- typed access ---------------------------------------------------------------------
    def obj(self, value: Any, path: str) -> dict:
        if not isinstance(value, dict):
            self.fail(path, f"is {kind_of(value)}, not an object")
        return value

    def field(self, parent: dict, key: str, path: str) -> Any:
        if key not in parent:
            self.fail(path, f"lacks '{key}'")
        return parent[key]

    def lst(self, value: Any, path: str, cap: str | None = None, exact: int | None = None) -> list:
        if not isinstance(value, list):
            self.fail(path, f"is {kind_of(value)}, not a list")
        if exact is not None and len(value) != exact:
            self.fail(path, f"has {len(value)} items, not {exact}")
        if cap is not None and len(value) > limit(cap):
            self.fail(path, f"has {len(value)} items, over the cap of {limit(cap)} ({cap})")
        return value

    def string(self, value: Any, path: str, cap: str = "TEXT_CHARS") -> str:
        if not isinstance(value, str):
            self.fail(path, f"is {kind_of(value)}, not a string")
        if len(value) > limit(cap):
            self.fail(path, f"is {len(value)} characters, over the cap of {limit(cap)} ({cap})")
        return value

    def integer(self, value: Any, path: str, lo: int, hi: int) -> int:
        if type(value) is not int:
            self.fail(path, f"is {kind_of(value)}, not an integer")
        if not lo <= value <= hi:
            self.fail(path, f"is {value}, outside {lo}..{hi}")
        return value

    def boolean(self, value: Any, path: str) -> bool:
        if type(value) is not bool:
            self.fail(path, f"is {kind_of(value)}, not a bool")
        return value

    def one_of(self, value: Any, path: str, allowed) -> str:
        if not isinstance(value, str) or value not in allowed:
            self.fail(path, f"is {str(value)[:80]!r}, not one of {sorted(allowed)}")
        return value

    def scalar(self, value: Any, path: str) -> None:
        if isinstance(value, str):
            self.string(value, path)
        elif value is not None and type(value) not in (bool, int, float):
            self.fail(path, f"is {kind_of(value)}, not a null, bool, number or string")

    def expr(self, value: Any, path: str) -> str:
        text = self.string(value, path, "EXPR_CHARS")
        if text not in self.texts:
            self.texts[text] = None
            self.expr_chars += len(text)
            if self.expr_chars > limit("EXPR_DISTINCT_CHARS"):
                self.fail(path, f"the distinct expressions pass the cap of {limit('EXPR_DISTINCT_CHARS')} "
                                "characters (EXPR_DISTINCT_CHARS)")
        return text

    # --- programs --------------------------------------------------------------------------
    def program(self, value: Any, path: str, n_inputs: int) -> tuple[bool, Any]:
        """Checks one RPN program; returns (whether it is constant, its value when it is)."""
        tokens = self.lst(value, path, "PROGRAM_TOKENS")
        self.tokens += len(tokens)
        if self.tokens > limit("PROGRAM_TOKENS_TOTAL"):
            self.fail(path, f"the programs pass the cap of {limit('PROGRAM_TOKENS_TOTAL')} tokens "
                            "(PROGRAM_TOKENS_TOTAL)")
        stack: list[tuple[int, bool]] = []  # (first token, constant) of each value on the stack
        for i, token in enumerate(tokens):
            at = f"{path}[{i}]"
            if not isinstance(token, list) or not token or not isinstance(token[0], str):
                self.fail(at, "is not a token [TAG, ...]")
            tag, arity = token[0], {"int": 2, "float": 2, "size": 3, "stride": 3, "arg": 2, "op": 2, "unary": 2,
                                    "bool": 3, "call": 3}.get(token[0])
            if arity is None:
                self.fail(at, f"'{tag[:40]}' is not one of int/float/size/arg/op/unary/bool/call/stride")
            if len(token) != arity:
                self.fail(at, f"'{tag}' has {len(token) - 1} operands, not {arity - 1}")
            pops, constant = 0, True
            if tag == "int":
                text = token[1]
                if not isinstance(text, str) or len(text) > 41 or not _DECIMAL.match(text) or not (
                        _I128[0] <= int(text) <= _I128[1]):
                    self.fail(at, "is not [\"int\", DECIMAL] of a 128-bit integer")
            elif tag == "float":
                if type(token[1]) not in (int, float):
                    self.fail(at, "is not [\"float\", NUMBER]")
            elif tag in ("size", "stride", "arg"):
                if type(token[1]) is not int or not 0 <= token[1] < n_inputs:
                    self.fail(at, f"input {str(token[1])[:20]} is out of range (the op has {n_inputs})")
                if tag != "arg":
                    self.integer(token[2], at, 0, limit("DIMS") - 1)
                constant = False
            elif tag == "op":
                self.one_of(token[1], at, BINARY)
                pops = 2
            elif tag == "unary":
                self.one_of(token[1], at, ("neg", "pos", "not"))
                pops = 1
            else:
                name = self.one_of(token[1], at, ("and", "or") if tag == "bool" else ("min", "max", "next_pow2"))
                pops = self.integer(token[2], at, 1, 1 if name == "next_pow2" else limit("PROGRAM_TOKENS"))
            if pops:
                if pops > len(stack):
                    self.fail(at, "pops more values than the program pushed")
                operands = stack[len(stack) - pops:]
                del stack[len(stack) - pops:]
                constant = all(c for _, c in operands)
                if not constant:
                    bounds = [s for s, _ in operands] + [i]
                    for k, (start, const) in enumerate(operands):
                        if const:
                            v = self.constant(tokens[start:bounds[k + 1]], at)
                            if k == 1 and tag == "op" and token[1] in ("//", "%", "/") and v == 0:
                                self.fail(at, "divides by a constant zero")
                start = operands[0][0]
            else:
                start = i
            stack.append((start, constant))
        if len(stack) != 1:
            self.fail(path, f"leaves {len(stack)} values on the stack, not 1")
        if stack[0][1]:
            return True, self.constant(tokens, path)
        return False, None

    def constant(self, tokens: list, path: str) -> Any:
        try:
            return evaluate(tokens, [])
        except EvalError as exc:
            self.fail(path, f"a constant part is an error ({exc})")

    def text_program(self, text: str, program: Any, names: list[str], path: str) -> None:
        """The Python loader evaluates ``text``: it must be the program the runtime evaluates."""
        try:
            compiled = _compiled(tuple(names), text)
        except BundleError as exc:
            self.fail(path, f"the expression does not compile ({exc})")
        if compiled != program:
            self.fail(path, "the program is not the compiled expression text")


_COMPILED: dict[tuple, list] = {}


def _compiled(names: tuple, text: str) -> list:
    key = (names, text)
    found = _COMPILED.get(key)
    if found is None:
        if len(_COMPILED) > 8192:
            _COMPILED.clear()
        found = _COMPILED[key] = compile_rpn(text, list(names))
    return found
