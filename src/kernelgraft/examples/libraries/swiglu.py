"""SwiGLU gate ``silu(gate) * up`` with candidates from Liger-Kernel (Triton), kernelgraft's own
Triton kernel and PyTorch."""

from __future__ import annotations

import torch

import kernelgraft as kg

from .. import swiglu as _own
from .._special import nan_inf
from . import _liger

IMPLS = [_liger.swiglu, _own.TRITON]


def sample_inputs(device: str = "cpu", dtype: torch.dtype = torch.float32):
    for shape in [(2, 8), (3, 5, 11), (4, 16, 352), (64, 1000)]:
        yield (torch.randn(shape, device=device, dtype=dtype) * 3, torch.randn(shape, device=device, dtype=dtype))
    for dt in (torch.float16, torch.bfloat16):
        yield (torch.randn(33, 97, device=device, dtype=dt) * 3, torch.randn(33, 97, device=device, dtype=dt))
        yield (nan_inf(torch.randn(5, 33, device=device, dtype=dt)), nan_inf(torch.randn(5, 33, device=device, dtype=dt)))


BENCH_SHAPES = {
    "short": {"prefill": [(16, 14336), (4096, 14336)]},
    "llm": {"decode": [(1, 14336), (16, 14336)], "prefill": [(4096, 14336), (16384, 14336)]},
}


def bench_case(tokens, inter, device: str = "cuda"):
    return (
        torch.randn(tokens, inter, device=device, dtype=torch.bfloat16) * 3,
        torch.randn(tokens, inter, device=device, dtype=torch.bfloat16))


@kg.op("kglib::swiglu", impls=IMPLS, sample_inputs=sample_inputs,
       dtypes=(torch.float32, torch.float16, torch.bfloat16))
def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, elementwise, same shape and dtype."""
    if gate.dtype != up.dtype or gate.shape != up.shape:
        raise kg.InputError(f"kglib::swiglu: 'gate' and 'up' must have one shape and dtype, got "
                            f"{gate.dtype}{list(gate.shape)} and {up.dtype}{list(up.shape)}")
    return torch.nn.functional.silu(gate) * up
