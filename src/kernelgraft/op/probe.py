"""What the reference says about a call before a kernel runs, judged without the call's values.

A kernel does not check its inputs; the reference does (its shape checks, its dtype dispatch). Run on
the caller's data, though, the reference would make the verdict depend on values and on history: an
out-of-range index refused on the first call with a new dtype combination, computed silently by
the kernel afterwards. So the reference is asked only questions whose answer the signature decides:

- ``fake_probe`` (once per plan, i.e. per signature): the reference on fake tensors of the same
  shapes, strides and dtypes, under a shape environment so a data-dependent step (a boolean mask)
  gives an unbacked size instead of stopping the run. An ``InputError`` the reference raises itself,
  a shape mismatch or an ``IndexError`` becomes the call's ``InputError``; anything fake tensors
  cannot decide (a branch on values, ``.item()``, an op without a fake kernel) is no verdict.
- ``zeros_probe`` (once per combination of device type and dtypes, for ops without ``dtypes=``):
  the reference on zero-filled tensors of the same layout, because fake tensors skip most dtype
  checks (``F.gelu`` on int64 runs on fake tensors). Zero is a valid value for every index.

``meta_outputs`` runs the meta function under a tracer's fake mode (``torch.compile``, export) and
turns a data-dependent shape (``data_dependent``: torch's errors for one, or an unbacked size the
meta left behind) into a ``SpecError`` naming ``register_meta``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any

import torch
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)

from ..errors import InputError, SpecError, out_of_memory
from ..verify.oracle import tensors
from .limits import quiet_fake_tensor_errors


__all__ = ["data_dependent", "meta_error", "meta_outputs", "fake_probe", "zeros_probe", "reason", "refusal",
           "shape_error"]

log = logging.getLogger(__name__)

_DATA_DEPENDENT = (DataDependentOutputException, DynamicOutputShapeException)
# torch.fx.experimental.symbolic_shapes imports sympy (0.3-0.8 s): it is imported where a shape
# environment is made (fake_probe), not with kernelgraft; its errors can only come from it once it is.
_SYMBOLIC = "torch.fx.experimental.symbolic_shapes"
_SHAPE_PHRASES = ("broadcast", "must match the size", "shapes cannot be multiplied", "size mismatch",
                  "shape mismatch", "does not match the shape", "Expected size", "invalid for input of size")


def data_dependent(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) is torch saying a shape or value depends on data."""
    kinds = _DATA_DEPENDENT
    symbolic = sys.modules.get(_SYMBOLIC)
    if symbolic is not None:
        kinds += (symbolic.GuardOnDataDependentSymNode, symbolic.PendingUnbackedSymbolNotFound)
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, kinds):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def meta_error(op: Any, exc: BaseException | None, what: str) -> SpecError:
    """The error for a meta function that cannot give shapes without data (``what`` happened)."""
    detail = f" ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]})" if exc is not None else ""
    return SpecError(
        f"{op.name}: the {'meta function' if op.has_meta else 'reference'} {what}"
        f"{detail}: kernelgraft allocates outputs before a kernel runs, so their shapes must follow from "
        "the inputs' shapes alone. Give the op a meta function that computes them without data: "
        "op.register_meta(fn) (fn takes the op's arguments and returns empty tensors of the output "
        "shapes, e.g. torch.empty_like(x))")


def shape_error(exc: BaseException) -> bool:
    """Whether the reference failed because the inputs' shapes do not fit (a broadcast or size
    check in torch, an index past a dimension), rather than for a reason of its own."""
    if isinstance(exc, IndexError):
        return True
    return isinstance(exc, (RuntimeError, ValueError)) and any(p in str(exc) for p in _SHAPE_PHRASES)


def reason(exc: BaseException) -> str:
    """``Type: first line`` of an exception (kept instead of the exception: no frames held)."""
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


def refusal(op: Any, args: Sequence[Any], why: str, how: str = "", *, shapes: bool = True) -> InputError:
    """The call's ``InputError`` for a reference that refused its inputs, saying ``why``; the
    tensors shown as ``name=dtype[shape]`` (``shapes=False``: ``name=dtype``)."""
    shown = ", ".join(
        f"{p.name}={str(a.dtype).removeprefix('torch.')}{list(a.shape) if shapes else ''}"
        for p, a in zip(op.signature.params, args) if isinstance(a, torch.Tensor))
    return InputError(f"{op.name}: the reference does not accept these inputs ({shown}){how}: it raised {why}")


def _fake_args(mode: FakeTensorMode, args: Sequence[Any]) -> tuple:
    def fake(t: torch.Tensor) -> torch.Tensor:
        return mode.from_tensor(t, static_shapes=True)

    return tuple(fake(a) if isinstance(a, torch.Tensor)
                 else [fake(t) for t in a] if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)
                 else a for a in args)


def fake_probe(op: Any, args: Sequence[Any]) -> None:
    """Run the reference on fake tensors like ``args``; raise the call's ``InputError`` if it
    refuses their shapes (see the module docstring). Writes nothing, reads no data."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv  # sympy: see _SYMBOLIC

    try:
        with quiet_fake_tensor_errors(), FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=False) as mode:
            with torch.no_grad():
                op.reference(*_fake_args(mode, args))
    except InputError:
        raise
    except Exception as exc:
        if not data_dependent(exc) and shape_error(exc):
            raise refusal(op, args, reason(exc)) from exc
        log.debug("%s: no verdict from the reference on fake tensors: %s: %s", op.name, type(exc).__name__, exc)


def _zeros(t: torch.Tensor) -> torch.Tensor:
    """Zeros with ``t``'s shape, strides, dtype and device (a view of a zeroed span)."""
    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 0
    return torch.zeros(span, dtype=t.dtype, device=t.device).as_strided(t.shape, t.stride())


def zeros_probe(op: Any, args: Sequence[Any]) -> tuple[bool, str | None]:
    """Run the reference on zero-filled tensors like ``args``: (judged, why it refused or None).
    Out of memory is no verdict (judged False): a naive reference may not fit where the kernel
    does, which says nothing about dtypes."""
    try:
        probe = tuple(_zeros(a) if isinstance(a, torch.Tensor)
                      else [_zeros(t) for t in a] if isinstance(a, (list, tuple)) and a
                      and isinstance(a[0], torch.Tensor) else a for a in args)
        with torch.no_grad():
            op.reference(*probe)
    except Exception as exc:
        if out_of_memory(exc):
            return False, None
        return True, reason(exc)
    return True, None


def meta_outputs(op: Any, args: tuple) -> Any:
    """The meta function's outputs under the tracer's fake mode, or a ``SpecError`` naming
    ``register_meta`` where it depends on data: a data-dependent size would otherwise surface
    as a Dynamo internal error (an unbacked symbol not in the outputs) with no hint to the op."""
    mode = detect_fake_mode(tuple(tensors(args)))
    shape_env = getattr(mode, "shape_env", None)
    pending = shape_env.pending_fresh_unbacked_symbols if shape_env is not None else None
    before = len(pending) if pending is not None else 0
    try:
        outs = op.meta(*args)
    except Exception as exc:
        if data_dependent(exc):
            raise meta_error(op, exc, "has data-dependent shapes") from exc
        raise
    if pending is not None and len(pending) > before:
        del pending[before:]  # the trace stops here: leave the environment as it was
        raise meta_error(op, None, "computes sizes from the data of its inputs (a boolean mask, nonzero "
                         "or .item())")
    return outs
