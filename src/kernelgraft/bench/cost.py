"""Bytes and flops of one call: the op's ``cost`` hook, or a default from tensor sizes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["call_cost", "default_bytes", "describe_inputs"]


def _tensors(values: Any):
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (t for t in v if isinstance(t, torch.Tensor))


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def default_bytes(args: Sequence[Any], outputs: Any) -> int:
    """Every tensor input read once plus every output written once (a mutated input counts once)."""
    outs = outputs if isinstance(outputs, (list, tuple)) else ([] if outputs is None else [outputs])
    return sum(_nbytes(t) for t in _tensors(args)) + sum(_nbytes(t) for t in _tensors(outs))


def call_cost(op: Any, args: Sequence[Any], outputs: Any) -> tuple[float, float]:
    """(bytes, flops) of one call of ``op`` on ``args`` that returned ``outputs``."""
    hook = getattr(op, "cost", None)
    if hook is not None:
        nbytes, flops = hook(*args)
        return float(nbytes), float(flops)
    return float(default_bytes(args, outputs)), 0.0


def describe_inputs(args: Sequence[Any]) -> str:
    """A short label of the inputs: ``bf16[64,4096] bf16[4096] 1e-06``."""
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            dt = str(a.dtype).replace("torch.", "").replace("bfloat16", "bf16").replace("float", "f")
            parts.append(f"{dt}[{','.join(map(str, a.shape))}]")
        elif isinstance(a, str):
            parts.append(repr(a))
        else:
            parts.append(str(a))
    return " ".join(parts)
