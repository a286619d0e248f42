"""Shapes that do not fit: the ``InputError`` for a reference (or meta function) that cannot compute
output shapes for the arguments, the same in eager planning and in ``torch.compile``'s tracing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InputError, describe


__all__ = ["named", "shape_error"]


def _is_shape_error(exc: Exception) -> bool:
    """Whether the reference failed on fake tensors because the inputs' shapes do not fit (a
    broadcast or size check in torch), rather than because it cannot run on fake tensors."""
    text = str(exc)
    return isinstance(exc, (RuntimeError, IndexError, ValueError)) and any(
        phrase in text for phrase in ("broadcast", "must match the size", "shapes cannot be multiplied",
                                      "size mismatch", "does not match the shape", "Expected size"))


def named(op: Any, args: Sequence[Any]) -> str:
    """The arguments by parameter name (``x=Tensor(shape=(3,), ...), eps=float 1e-06``)."""
    return ", ".join(f"{p.name}={describe(a)}" for p, a in zip(op.signature.params, args))


def shape_error(op: Any, args: Sequence[Any], exc: Exception) -> InputError | None:
    """The ``InputError`` for a reference (or meta function) that failed on fake tensors because
    the arguments' shapes do not fit together, naming the op and each argument; None for any
    other failure. Raised in eager planning and inside ``torch.compile``'s tracing alike (where
    torch wraps it in its own ``TorchRuntimeError``, which carries this message)."""
    if not _is_shape_error(exc):
        return None
    return InputError(
        f"{op.name}: the reference cannot compute output shapes for these inputs ({named(op, args)}): "
        f"their shapes do not fit together: {str(exc).splitlines()[0]}"
    )
