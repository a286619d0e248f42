"""Output comparison for grafts: the grafted computation must equal the original within tolerance.

Outputs may be nested (tuples, dicts, Hugging Face ``ModelOutput``): they are flattened with
``torch.utils._pytree`` and compared leaf by leaf. Tolerances are per dtype; an op's own
``tolerances`` (a relative tolerance per dtype) take precedence, and ``tolerance=(atol, rtol)``
overrides both. ``atol`` scales with the largest magnitude in the expected tensor, so logits of any
scale are judged alike.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils import _pytree as pytree

__all__ = ["DEFAULT_TOLERANCES", "tolerance", "compare", "clone_inputs"]

log = logging.getLogger(__name__)

DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (4e-2, 4e-2),
}


def tolerance(
    dtype: torch.dtype, op: Any = None, override: tuple[float, float] | None = None
) -> tuple[float, float]:
    """(atol, rtol) for comparing tensors of ``dtype``."""
    if override is not None:
        return float(override[0]), float(override[1])
    own: Mapping[torch.dtype, float] = getattr(op, "tolerances", None) or {}
    if dtype in own:
        return float(own[dtype]), float(own[dtype])
    return DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))


def compare(
    expected: Any, got: Any, *, op: Any = None, override: tuple[float, float] | None = None
) -> str | None:
    """None when ``got`` equals ``expected`` within tolerance, else a one-line description of the
    worst difference (which output, max abs error, the tolerance)."""
    exp_leaves, exp_spec = pytree.tree_flatten(expected)
    got_leaves, got_spec = pytree.tree_flatten(got)
    if len(exp_leaves) != len(got_leaves):
        return f"output structure differs: expected {exp_spec}, got {got_spec}"
    for i, (e, g) in enumerate(zip(exp_leaves, got_leaves)):
        where = f"output leaf {i}"
        if isinstance(e, torch.Tensor) != isinstance(g, torch.Tensor):
            return f"{where}: expected {type(e).__name__}, got {type(g).__name__}"
        if not isinstance(e, torch.Tensor):
            if not isinstance(e, (int, float, bool, str, type(None))):
                continue  # opaque objects (a model's cache): their tensors are not outputs we judge
            if e != g:
                return f"{where}: expected {e!r}, got {g!r}"
            continue
        if e.shape != g.shape or e.dtype != g.dtype:
            return (
                f"{where}: expected shape {tuple(e.shape)} {e.dtype}, got shape {tuple(g.shape)} {g.dtype}"
            )
        if not e.is_floating_point() and not e.is_complex():
            if not torch.equal(e, g):
                return f"{where}: integer/bool outputs differ"
            continue
        atol, rtol = tolerance(e.dtype, op, override)
        e64, g64 = e.detach().double().cpu(), g.detach().double().cpu()
        if not torch.equal(torch.isnan(e64), torch.isnan(g64)):
            return f"{where}: NaNs in different places"
        finite = torch.isfinite(e64) & torch.isfinite(g64)
        if not torch.equal(e64[~finite].nan_to_num(), g64[~finite].nan_to_num()):
            return f"{where}: infinities differ"
        if not finite.any():
            continue
        e64, g64 = e64[finite], g64[finite]
        scale = max(1.0, float(e64.abs().max()))
        err = (e64 - g64).abs()
        bound = atol * scale + rtol * e64.abs()
        if bool((err > bound).any()):
            return (
                f"{where}: max abs error {float(err.max()):.3g} (largest |expected| {scale:.3g}) "
                f"exceeds atol={atol:g}*scale, rtol={rtol:g} for {e.dtype}"
            )
    return None


def clone_inputs(value: Any) -> Any:
    """A copy of nested inputs with tensors cloned (so an in-place op cannot skew a comparison)."""
    return pytree.tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, value)
