"""What serves a key while it is tuned off the caller's path: never a kernel the gate has not passed.

In order:

1. **The nearest tuned bucket.** Among this process's decisions for the same op (fingerprint), the
   same device and toolchain, the same tolerances and the same arguments but for tensor sizes
   (dtypes, layouts, ranks and every non-tensor argument equal), the one whose bucketed sizes are
   closest (the sum over dimensions of ``|log2 a - log2 b|``; ties to the smaller sizes, then the
   older decision) serves its best-ranked candidate that supports these inputs. A decision whose
   ranking has none goes to the next nearest.
2. **The prune hook's pick**, among the kernels that passed the gate for this op on inputs of the
   same dtypes, device, toolchain and tolerances (other sizes or layouts): the first of them in the
   order the op's ``prune`` hook puts the supported kernels.
3. **The eager reference** (None), which needs no gate: it is the oracle.

``torch:compile`` is never served meanwhile: a shape it has not seen recompiles inside the call.
A kernel chosen here may still compile for the new sizes on its first call where its backend
specialises on them (a Triton constexpr block size); with the compile cache warm that is quick.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from ..op.compete import TORCH, is_torch, is_torch_compile
from ..spec import Config

__all__ = ["meanwhile", "distance"]

_SAME = ("schema", "op", "fingerprint", "env", "tolerances")


def _log2(size: Any) -> float:
    return math.log2(size) if isinstance(size, (int, float)) and size > 0 else -1.0


def _desc_distance(a: Any, b: Any) -> float | None:
    """How far two argument descriptors are apart in tensor sizes; None when they differ in more."""
    if isinstance(a, list) and isinstance(b, list) and a[:1] == b[:1] == ["T"] and len(a) == len(b) == 4:
        _, dtype_a, shape_a, layout_a = a
        _, dtype_b, shape_b, layout_b = b
        if dtype_a != dtype_b or layout_a != layout_b or len(shape_a) != len(shape_b):
            return None
        return sum(abs(_log2(x) - _log2(y)) for x, y in zip(shape_a, shape_b))
    if isinstance(a, list) and isinstance(b, list) and a[:1] == b[:1] == ["L"] and len(a) == len(b) == 2:
        if len(a[1]) != len(b[1]):
            return None
        parts = [_desc_distance(x, y) for x, y in zip(a[1], b[1])]
        return None if any(p is None for p in parts) else sum(parts)  # type: ignore[misc]
    return 0.0 if a == b else None


def distance(key: dict[str, Any], other: dict[str, Any]) -> float | None:
    """How far two keys (``TuneKey.as_json()`` forms) are apart in tensor sizes; None when they
    differ in anything else.

    >>> k = {"op": "a", "args": [["T", "torch.float32", [1024], "ca16"], ["V", True]]}
    >>> distance(k, {**k, "args": [["T", "torch.float32", [4096], "ca16"], ["V", True]]})
    2.0
    >>> distance(k, {**k, "args": [["T", "torch.float16", [1024], "ca16"], ["V", True]]}) is None
    True
    """
    if any(key.get(name) != other.get(name) for name in _SAME):
        return None
    a, b = key.get("args"), other.get("args")
    if not isinstance(a, list) or not isinstance(b, list) or len(a) != len(b):
        return None
    total = 0.0
    for x, y in zip(a, b):
        d = _desc_distance(x, y)
        if d is None:
            return None
        total += d
    return total


def _dtypes(key: dict[str, Any]) -> list[Any]:
    """The key's arguments with tensor sizes and layouts left out (what the prune pick keeps)."""
    out: list[Any] = []
    for desc in key.get("args") or []:
        if isinstance(desc, list) and desc[:1] == ["T"] and len(desc) == 4:
            out.append(("T", desc[1], len(desc[2])))
        elif isinstance(desc, list) and desc[:1] == ["L"] and len(desc) == 2:
            out.append(("L", tuple(_dtypes({"args": desc[1]}))))
        else:
            out.append(repr(desc))
    return out


def _ident(entry: dict[str, Any], where: str) -> tuple | None:
    try:
        return int(entry["impl"]), Config.of(entry["config"], where=where)
    except Exception:  # an entry that does not parse names no candidate
        return None


def _servable(candidates: Sequence[Any]) -> dict[tuple, Any]:
    return {(c.index, c.config): c for c in candidates if not is_torch_compile(c)}


def meanwhile(op: Any, candidates: Sequence[Any], args: tuple, key: dict[str, Any],
              decisions: Iterable[Any]) -> Any:
    """The candidate that serves ``args`` while their key is tuned, or None for the reference.
    ``decisions``: the tuner's (objects with ``key``, ``ranking``, ``created``)."""
    offered = _servable(candidates)
    near: list[tuple[float, list, float, Any]] = []
    same_dtypes: list[Any] = []
    dtypes = _dtypes(key)
    for d in decisions:
        if not d.ranking or not isinstance(d.key, dict):
            continue
        gap = distance(key, d.key)
        if gap is not None:
            sizes = [_log2(s) for desc in d.key.get("args", []) if isinstance(desc, list) and desc[:1] == ["T"]
                     for s in desc[2]]
            near.append((gap, sizes, d.created, d))
        elif all(key.get(n) == d.key.get(n) for n in _SAME) and _dtypes(d.key) == dtypes:
            same_dtypes.append(d)
    for _, _, _, d in sorted(near, key=lambda t: t[:3]):
        for entry in d.ranking:
            found = offered.get(_ident(entry, op.name))  # type: ignore[arg-type]
            if found is not None:
                return found
    verified = {ident for d in same_dtypes for e in d.ranking if e.get("backend") != TORCH
                for ident in [_ident(e, op.name)] if ident is not None}
    hook = getattr(op, "prune", None)
    if verified and hook is not None:
        kernels = [c for c in candidates if not is_torch(c)]
        try:
            order = list(hook(list(kernels), *args) or [])
        except Exception:  # a hook that fails picks nothing here; tuning says so when it runs it
            order = []
        for c in order:
            if (getattr(c, "index", None), getattr(c, "config", None)) in verified and c in kernels:
                return c
    return None
