"""Sample inputs for checks: the op's own samples plus non-contiguous variants."""

from __future__ import annotations

import inspect
from typing import Any

import torch

__all__ = ["samples", "noncontiguous"]


def samples(op: Any, device: str) -> list[tuple]:
    """The op's ``sample_inputs``, called with the device when it takes one."""
    fn = op.sample_inputs
    if fn is None:
        return []
    try:
        takes_device = bool(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        takes_device = True
    produced = fn(device) if takes_device else fn()
    out = []
    for item in produced:
        out.append(tuple(item) if isinstance(item, (tuple, list)) else (item,))
    return out


def _strided_copy(t: torch.Tensor) -> torch.Tensor:
    """Same shape and values, but every dimension of size > 1 strided (not contiguous)."""
    if t.dim() == 0 or t.numel() <= 1:
        return t
    big = torch.empty(*[2 * s for s in t.shape], dtype=t.dtype, device=t.device)
    view = big[tuple(slice(None, None, 2) for _ in t.shape)]
    view.copy_(t)
    return view


def noncontiguous(op: Any, args: tuple) -> tuple | None:
    """A copy of ``args`` whose tensors (mutated ones too) are strided views, or None when no
    tensor can be made non-contiguous."""
    changed = False
    out: list[Any] = []
    for value in args:
        if isinstance(value, torch.Tensor) and value.numel() > 1:
            out.append(_strided_copy(value))
            changed = True
        else:
            out.append(value)
    return tuple(out) if changed else None
