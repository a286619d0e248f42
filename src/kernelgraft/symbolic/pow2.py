"""``triton.next_power_of_2`` as one call of the bundle grammar, ``next_pow2(n)``.

Traced on a symbolic size, Triton's bit-twiddling body (``n -= 1; n |= n >> 1; ... n |= n >> 32;
n + 1``) becomes a sympy expression of a kilobyte or more, and every guard, grid and output rule
that uses it repeats it: a bundle of the rmsnorm example grew to megabytes and loaded in seconds.
While a launch is traced, ``traced_next_pow2`` makes the function return a fresh size symbol for
a symbolic argument instead; the tracer writes that symbol as ``next_pow2(<argument>)``. The
ShapeEnv reasons about it as about any other size (its guards name it), so only the relation to
its argument is lost, which can only add a guard that always holds.

>>> [next_pow2(n) for n in (0, 1, 2, 3, 5, 1024, 1025)]
[0, 1, 2, 4, 8, 1024, 2048]
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

from .expr import next_pow2, to_text

__all__ = ["next_pow2", "traced_next_pow2"]

_serial = itertools.count()


def _target() -> tuple[Any, str]:
    """(object, attribute) holding Triton's Python function: Triton 3.x wraps it in a
    ConstexprFunction whose ``fn`` every alias (``from triton import next_power_of_2``) shares."""
    import triton

    wrapper = triton.next_power_of_2
    if hasattr(wrapper, "fn") and callable(wrapper.fn):
        return wrapper, "fn"
    return triton, "next_power_of_2"  # an older Triton: a plain function (aliases are not seen)


@contextlib.contextmanager
def traced_next_pow2(env: Any, symbols: dict[Any, str]) -> Iterator[None]:
    """Within the block, ``triton.next_power_of_2`` of a symbolic size is a size symbol of ``env``
    named ``next_pow2(...)`` in ``symbols``; of a plain int it is Triton's own function."""
    import torch

    try:
        holder, attr = _target()
    except ImportError:  # no Triton: nothing calls it
        yield
        return
    original = getattr(holder, attr)
    made: dict[Any, torch.SymInt] = {}

    def replacement(n: Any) -> Any:
        if env is None or not isinstance(n, torch.SymInt) or n.node.expr.is_number:
            return original(n)
        expr = n.node.expr
        if expr not in made:
            text = f"next_pow2({to_text(expr, symbols)})"  # Unsupported: not a size expression
            hint = n.node.hint if n.node.hint is not None else int(n)
            made[expr] = _symbol(env, next_pow2(int(hint)), text, symbols)
        return made[expr] if made[expr] is not None else original(n)

    setattr(holder, attr, replacement)
    try:
        yield
    finally:
        setattr(holder, attr, original)


def _symbol(env: Any, value: int, text: str, symbols: dict[Any, str]) -> Any:
    """A SymInt of a fresh size symbol of ``env`` with the sample's value, or None where the
    ShapeEnv made it a constant (the caller then keeps Triton's own expansion)."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    sym = env.create_symbol(value, ConstantSource(f"kg_next_pow2_{next(_serial)}"),
                            dynamic_dim=DimDynamic.DYNAMIC)
    if not getattr(sym, "is_Symbol", False):
        return None
    symbols[sym] = text
    return env.create_symintnode(sym, hint=value)
