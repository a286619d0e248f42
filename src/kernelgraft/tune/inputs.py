"""Private copies of a call's arguments, for a tuning that runs later on another thread.

The caller goes on using (and writing) its tensors the moment its call returns, so a background
tuning works on copies taken at the call. Copies, not regenerated inputs: an index argument (a
slot mapping, a routing table) must stay valid for the other arguments, and a kernel's speed can
depend on the values. Each copy keeps what the tuning key and the candidates' ``supports`` read:
shape, strides, dtype, device, and the data pointer's offset from 16-byte alignment; the storage
span the view covers is copied, so a non-contiguous or overlapping (expanded) view stays one.

On CUDA the copies are enqueued on the caller's current stream (ordered after whatever produced
the arguments, and before anything the caller does next) and an event is recorded after them: the
worker's stream waits for that event, never the caller. Copies are made outside inference mode
and without autograd history, so the worker may write them (mutating candidates do).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["tensors_of", "nbytes", "clone_args"]

_ALIGN = 16


def tensors_of(args: tuple) -> Iterator[torch.Tensor]:
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (t for t in a if isinstance(t, torch.Tensor))


def _span(t: torch.Tensor) -> int:
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) if t.numel() else 0


def nbytes(args: tuple) -> int:
    """The bytes ``clone_args(args)`` allocates (at most)."""
    return sum((_span(t) * t.element_size() + _ALIGN) for t in tensors_of(args))


def _clone(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if type(t) is not torch.Tensor or t.layout != torch.strided:
        raise TypeError(f"cannot copy a {type(t).__name__} with layout {t.layout} for a background tuning")
    if not t.numel():
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    span, item = _span(t), t.element_size()
    buf = torch.empty(span + max(1, _ALIGN // item), dtype=t.dtype, device=t.device)
    gap = (t.data_ptr() - buf.data_ptr()) % _ALIGN  # the caller's misalignment, reproduced
    shift = gap // item if gap % item == 0 else 0
    buf[shift:shift + span].copy_(t.as_strided((span,), (1,), t.storage_offset()))
    return buf.as_strided(t.shape, t.stride(), shift)


def clone_args(args: tuple) -> tuple[tuple, Any]:
    """(copies of ``args``, the CUDA event after the copies or None). Non-tensor arguments are
    shared (they are immutable values); tensor lists become lists of copies."""
    with torch.inference_mode(False), torch.no_grad():
        out = tuple(
            _clone(a) if isinstance(a, torch.Tensor)
            else [_clone(t) for t in a] if isinstance(a, (list, tuple)) and a and all(
                isinstance(t, torch.Tensor) for t in a)
            else a
            for a in args)
    ready = None
    first = next(tensors_of(args), None)
    if first is not None and first.device.type == "cuda":
        with torch.cuda.device(first.device):
            ready = torch.cuda.Event()
            ready.record()
    return out, ready
