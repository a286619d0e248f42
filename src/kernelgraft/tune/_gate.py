"""The correctness gate: before a candidate may win, its output must match the reference.

The reference runs once per key on float64 copies of the floating inputs (the oracle); each
candidate then runs on the tuning inputs with outputs poisoned (NaN, or a sentinel for integers)
so an unwritten element cannot pass by reusing a previous candidate's memory. An element passes
when ``|got - want| <= rtol * (|want| + rms(want))``; the rms term keeps near-zero elements of a
long reduction from failing on rounding alone. ``rtol`` depends on the output dtype and can be
set per op with ``kg.op(tolerances={dtype: rtol})``. Integer and bool outputs must match exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["RTOL", "Oracle", "make_oracle", "compare", "poisoned", "classify_error"]

RTOL = {
    torch.float64: 1e-7,
    torch.float32: 5e-3,  # allows TF32 tensor-core math
    torch.float16: 8e-3,
    torch.bfloat16: 3e-2,
    torch.complex64: 5e-3,
    torch.complex128: 1e-7,
}
_FP8_RTOL = 0.25


def rtol_for(dtype: torch.dtype, overrides: dict | None = None) -> float:
    if overrides and dtype in overrides:
        return float(overrides[dtype])
    if dtype in RTOL:
        return RTOL[dtype]
    return _FP8_RTOL if dtype.is_floating_point else 0.0


def _upcast(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            return value.detach().to(torch.complex128).clone()
        if value.is_floating_point():
            return value.detach().to(torch.float64).clone()
        return value.detach().clone()
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        return type(value)(_upcast(v) for v in value)
    return value


@dataclasses.dataclass
class Oracle:
    """The reference's outputs (and mutated inputs) in high precision."""

    outputs: tuple[torch.Tensor, ...]
    mutated: tuple[tuple[int, torch.Tensor], ...]  # (argument index, expected value after the call)
    precise: bool  # False when the reference could not run in float64 and ran in the input dtypes


def make_oracle(op: Any, args: Sequence[Any]) -> Oracle:
    """Run ``op.reference`` on float64 copies (or, if it refuses, on plain copies)."""
    mutated_idx = [i for i, p in enumerate(op.signature.params) if p.mutated]
    for precise in (True, False):
        copies = [_upcast(a) if precise else _clone(a) for a in args]
        try:
            with torch.no_grad():
                outs = op.reference(*copies)
        except Exception:
            if not precise:
                raise
            continue
        if outs is None:
            outs = ()
        elif isinstance(outs, torch.Tensor):
            outs = (outs,)
        outs = tuple(_wide(o) for o in outs)
        mutated = tuple((i, _wide(copies[i])) for i in mutated_idx if isinstance(copies[i], torch.Tensor))
        return Oracle(outs, mutated, precise)
    raise AssertionError("unreachable")


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        return type(value)(v.detach().clone() for v in value)
    return value


def _wide(t: torch.Tensor) -> torch.Tensor:
    if t.is_complex():
        return t.to(torch.complex128)
    return t.to(torch.float64) if t.is_floating_point() else t


def poisoned(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A fresh output filled with a value no correct kernel leaves behind."""
    if dtype.is_floating_point or dtype.is_complex:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    if dtype == torch.bool:
        return torch.empty(shape, dtype=dtype, device=device).fill_(True)
    info = torch.iinfo(dtype)
    return torch.full(shape, info.min + 7 if info.min < 0 else info.max - 7, dtype=dtype, device=device)


def compare(got: torch.Tensor, want: torch.Tensor, *, what: str, overrides: dict | None = None) -> str | None:
    """None when ``got`` matches ``want`` (the oracle), else why not, with the worst element."""
    if tuple(got.shape) != tuple(want.shape):
        return f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if got.numel() == 0:
        return None
    rtol = rtol_for(got.dtype, overrides)
    g = _wide(got)
    if rtol == 0.0 or not (g.is_floating_point() or g.is_complex()):
        bad = g != want
        if bool(bad.any()):
            idx = int(bad.flatten().nonzero()[0])
            return (f"{what}: {int(bad.sum())} of {bad.numel()} elements differ "
                    f"(first at flat index {idx}: {g.flatten()[idx].item()} vs {want.flatten()[idx].item()})")
        return None
    w = want
    both_nan = torch.isnan(g) & torch.isnan(w) if not g.is_complex() else torch.zeros_like(g.real, dtype=torch.bool)
    finite = torch.isfinite(w)
    scale = w[finite].abs().pow(2).mean().sqrt() if bool(finite.any()) else torch.tensor(0.0, device=w.device)
    err = (g - w).abs()
    bound = rtol * (w.abs() + scale)
    ok = (err <= bound) | both_nan | (torch.isinf(w) & (g == w))
    if bool(ok.all()):
        return None
    ratio = torch.where(ok, torch.zeros_like(err), torch.nan_to_num(err / bound.clamp_min(1e-300), nan=float("inf")))
    idx = int(ratio.flatten().argmax())
    return (f"{what}: {int((~ok).sum())} of {ok.numel()} elements off by more than rtol={rtol:g} "
            f"(worst at flat index {idx}: got {g.flatten()[idx].item():.6g}, expected "
            f"{w.flatten()[idx].item():.6g})")


def classify_error(exc: BaseException) -> str:
    """'compile' or 'launch', from the exception's type (Triton, NVRTC and kernelgraft names)."""
    names = " ".join(t.__name__ for t in type(exc).__mro__)
    if "Compil" in names or "PTXAS" in names.upper() or "NVRTC" in names.upper():
        return "compile"
    return "launch"
