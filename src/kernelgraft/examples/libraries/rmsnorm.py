"""RMSNorm forward as a training step runs it: the normalized rows and each row's 1/rms (kept for
the backward), with candidates from quack (CuTe DSL), Liger-Kernel (Triton, two kernels) and
PyTorch, tuned per shape.

>>> import torch
>>> from kernelgraft.examples.libraries.rmsnorm import rmsnorm
>>> y, rstd = rmsnorm(torch.tensor([[3.0, 4.0]]), torch.ones(2), 0.0)
>>> [round(v, 4) for v in y[0].tolist()], round(rstd.item(), 4)
([0.8485, 1.1314], 0.2828)
"""

from __future__ import annotations

import torch

import kernelgraft as kg

from .._special import nan_inf
from . import _liger, _quack

IMPLS = [_quack.rmsnorm, _liger.rmsnorm_row, _liger.rmsnorm_block]


def sample_inputs(device: str = "cpu", dtype: torch.dtype = torch.float32):
    """Odd and wide rows, a 3-d input, half precision with NaN and Inf, float32 weights."""
    for rows, cols in [(1, 8), (5, 64), (3, 1000), (17, 4096), (33, 136), (2, 7)]:
        yield (torch.randn(rows, cols, device=device, dtype=dtype), torch.randn(cols, device=device, dtype=dtype), 1e-6)
    yield (torch.randn(2, 3, 256, device=device, dtype=dtype), torch.randn(256, device=device, dtype=dtype), 1e-5)
    for dt in (torch.float16, torch.bfloat16):
        yield (torch.randn(9, 768, device=device, dtype=dt), torch.randn(768, device=device, dtype=dt), 1e-6)
        yield (nan_inf(torch.randn(4, 512, device=device, dtype=dt)), torch.randn(512, device=device, dtype=dt), 1e-6)


# Shapes for ``kernelgraft bench``: (tokens, hidden) bf16, Llama hidden sizes and per-head norms.
BENCH_SHAPES = {
    "short": {"hidden": [(16, 4096), (4096, 4096), (32768, 4096)], "head": [(65536, 128)]},
    "llm": {
        "hidden": [(1, 4096), (16, 4096), (4096, 4096), (32768, 4096), (4096, 8192), (16384, 8192)],
        "head": [(65536, 128), (262144, 128)],
    },
}


def bench_case(rows, cols, device: str = "cuda"):
    return (
        torch.randn(rows, cols, device=device, dtype=torch.bfloat16),
        torch.randn(cols, device=device, dtype=torch.bfloat16), 1e-6)


@kg.op("kglib::rmsnorm", impls=IMPLS, sample_inputs=sample_inputs,
       dtypes=(torch.float32, torch.float16, torch.bfloat16))
def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x * rstd * weight in x's dtype, rstd = 1/sqrt(mean(x**2) + eps) per row in float32)."""
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + eps)
    return (xf * rstd.unsqueeze(-1) * weight.float()).to(x.dtype), rstd
