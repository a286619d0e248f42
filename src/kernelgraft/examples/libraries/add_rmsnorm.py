"""Fused residual add + RMSNorm (a transformer block's pre-norm): the sum, its normalized rows and
each row's 1/rms, with candidates from quack (CuTe DSL), Liger-Kernel (Triton) and PyTorch."""

from __future__ import annotations

import torch

import kernelgraft as kg

from .._special import nan_inf
from . import _liger, _quack

IMPLS = [_quack.add_rmsnorm, _liger.add_rmsnorm]


def sample_inputs(device: str = "cpu", dtype: torch.dtype = torch.float32):
    for rows, cols in [(1, 8), (5, 64), (3, 1000), (17, 4096), (2, 7)]:
        yield (torch.randn(rows, cols, device=device, dtype=dtype), torch.randn(rows, cols, device=device, dtype=dtype),
               torch.randn(cols, device=device, dtype=dtype), 1e-6)
    for dt in (torch.float16, torch.bfloat16):
        yield (torch.randn(9, 768, device=device, dtype=dt), torch.randn(9, 768, device=device, dtype=dt),
               torch.randn(768, device=device, dtype=dt), 1e-6)
        yield (nan_inf(torch.randn(4, 512, device=device, dtype=dt)), torch.randn(4, 512, device=device, dtype=dt),
               torch.randn(512, device=device, dtype=dt), 1e-5)


BENCH_SHAPES = {
    "short": {"hidden": [(16, 4096), (4096, 4096), (32768, 4096)]},
    "llm": {"hidden": [(1, 4096), (16, 4096), (4096, 4096), (32768, 4096), (4096, 8192), (16384, 8192)]},
}


def bench_case(rows, cols, device: str = "cuda"):
    return (
        torch.randn(rows, cols, device=device, dtype=torch.bfloat16),
        torch.randn(rows, cols, device=device, dtype=torch.bfloat16),
        torch.randn(cols, device=device, dtype=torch.bfloat16), 1e-6)


@kg.op("kglib::add_rmsnorm", impls=IMPLS, sample_inputs=sample_inputs,
       dtypes=(torch.float32, torch.float16, torch.bfloat16))
def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rmsnorm(s) * weight, s, rstd) for s = x + residual rounded to x's dtype; rstd float32."""
    summed = x + residual
    sf = summed.float()
    rstd = torch.rsqrt(sf.pow(2).mean(-1) + eps)
    return (sf * rstd.unsqueeze(-1) * weight.float()).to(x.dtype), summed, rstd
