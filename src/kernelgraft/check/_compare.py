"""Comparing a kernel's output with the reference: poison, tolerances, relative error."""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["EXACT", "tolerance", "poison", "is_exact", "compare", "upcast"]

EXACT = 0.0
# Relative error ||out - ref|| / ||ref|| allowed per output dtype, against a float64 reference.
# One rounding of the output dominates: float16 has 11 bits, bfloat16 8; reductions add a little.
_TOLERANCE = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}


def is_exact(dtype: torch.dtype) -> bool:
    """Integer, bool and 8-bit float outputs are compared bit for bit."""
    return not dtype.is_floating_point or dtype.itemsize == 1


def tolerance(dtype: torch.dtype, overrides: Mapping[torch.dtype, float] | None = None) -> float:
    if overrides and dtype in overrides:
        return float(overrides[dtype])
    if is_exact(dtype):
        return EXACT
    return _TOLERANCE.get(dtype, 1e-2)


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill with a value no correct kernel produces by accident: NaN, or a byte pattern."""
    if t.dtype.is_floating_point and t.dtype.itemsize > 1:
        return t.fill_(float("nan"))
    if t.dtype == torch.bool:
        return t.fill_(True)
    return t.view(torch.uint8).fill_(0xA5).view(t.dtype) if t.numel() else t


def upcast(value):
    """float64 copy for floating tensors with more than 8 bits; other values unchanged."""
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point and value.dtype.itemsize > 1:
            return value.detach().to(torch.float64)
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(upcast(v) for v in value)
    return value


def compare(out: torch.Tensor, ref: torch.Tensor, tol: float) -> tuple[bool, float, str]:
    """(passed, error, note). error is relative for floats, mismatching elements for exact."""
    if out.shape != ref.shape:
        return False, float("inf"), f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    if tol == EXACT:
        if out.dtype != ref.dtype:
            return False, float("inf"), f"dtype {out.dtype} != reference {ref.dtype}"
        a = out.detach().contiguous().view(torch.uint8) if out.numel() else out
        b = ref.detach().contiguous().view(torch.uint8) if ref.numel() else ref
        bad = int((a.cpu() != b.cpu()).sum()) if out.numel() else 0
        return bad == 0, float(bad), f"{bad} bytes differ" if bad else ""
    o = out.detach().to(torch.float64).cpu()
    r = ref.detach().to(torch.float64).cpu()
    o_nan, r_nan = torch.isnan(o), torch.isnan(r)
    if not torch.equal(o_nan, r_nan):
        n = int((o_nan & ~r_nan).sum())
        return False, float("inf"), f"{n} NaN where the reference has none (unwritten or bad values)"
    o, r = o[~r_nan], r[~r_nan]
    if not torch.equal(torch.isinf(o), torch.isinf(r)) or not torch.equal(o[torch.isinf(o)], r[torch.isinf(r)]):
        return False, float("inf"), "infinities differ from the reference"
    finite = ~torch.isinf(r)
    o, r = o[finite], r[finite]
    denom = torch.linalg.vector_norm(r).item()
    err = torch.linalg.vector_norm(o - r).item() / (denom if denom > 0 else 1.0)
    return err <= tol, err, ""
