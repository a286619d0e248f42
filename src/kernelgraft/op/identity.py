"""How an op's options enter its identity (``KernelOp.identity``, the fingerprint behind default
names, tuning keys and bundles): functions by their source, dtypes by name, tolerances sorted, the
same in every process."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch  # noqa: F401  (the doctests name torch dtypes)

from ..spec import callable_source

__all__ = ["callable_identity", "tolerances_identity", "dtype_name"]


def callable_identity(fn: Callable | None) -> str | None:
    """A function as op fingerprints see it: its source (and that of the kernels it names), the
    same in every process; None stays None.

    A lambda's source is its whole line, which two lambdas can share, so what tells them apart is
    added: the column it starts at, its names, arguments and constants (never its bytecode, which
    differs between Python versions and would rename unnamed ops); a callable object without source
    text is named by its type.
    """
    if fn is None:
        return None
    try:
        text = callable_source(fn)
    except Exception:
        return f"{type(fn).__module__}.{type(fn).__qualname__}"
    code = getattr(fn, "__code__", None)
    if code is not None and code.co_name == "<lambda>":
        consts = [c for c in code.co_consts if isinstance(c, (int, float, str, bytes, bool))]
        positions = getattr(code, "co_positions", None)  # Python 3.11+
        # the span of the body within its line (the first instruction, RESUME, has no real place)
        spans = [(p[2], p[3]) for p in positions() if p[2] is not None and p[3]] if positions else []
        span = (min(a for a, _ in spans), max(b for _, b in spans)) if spans else None
        text += f"\n{span}:{code.co_varnames}:{code.co_names}:{consts!r}"
    return text


def tolerances_identity(tolerances: Mapping[Any, Any] | None) -> tuple[tuple[str, float], ...]:
    """``{torch.float16: 1e-2}`` as sorted ``(("float16", 0.01),)``: the same in every process.

    >>> tolerances_identity({torch.bfloat16: 0.02, torch.float16: 1e-3})
    (('bfloat16', 0.02), ('float16', 0.001))
    """
    return tuple(sorted((dtype_name(d), _plain(v)) for d, v in (tolerances or {}).items()))


def _plain(value: Any) -> Any:
    """A tolerance value in a JSON-stable form: numbers as floats, sequences as tuples of them."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _plain(v)) for k, v in value.items()))
    return repr(value)


def dtype_name(dtype: Any) -> str:
    """``torch.float16`` -> ``'float16'`` (a string stays as it is)."""
    return str(dtype).removeprefix("torch.")
