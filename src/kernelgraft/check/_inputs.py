"""Sample inputs for checks: the op's own samples plus non-contiguous variants."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["samples", "noncontiguous", "clone_args"]


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


def clone_args(args: tuple) -> tuple:
    """Clone tensors, keeping their strides (so non-contiguous stays non-contiguous)."""

    def clone(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            if not v.numel():
                return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
            # Copy the storage span the view covers and view it the same way: copy_ into
            # empty_strided refuses overlapping layouts (expanded, stride 0) that a sample may use.
            span = 1 + sum((size - 1) * stride for size, stride in zip(v.shape, v.stride()))
            flat = v.detach().as_strided((span,), (1,)).clone()
            return flat.as_strided(v.shape, v.stride(), 0)
        if isinstance(v, (list, tuple)):
            return type(v)(clone(x) for x in v)
        return v

    return tuple(clone(v) for v in args)


def iter_tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from iter_tensors(v)
