"""Fused residual add + RMSNorm (a transformer block's pre-norm): the sum, its normalized rows and
each row's 1/rms, with candidates from quack (CuTe DSL), Liger-Kernel (Triton) and PyTorch."""

from __future__ import annotations

import torch

import kernelgraft as kg
from kernelgraft.verify import oracle

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


# The sum is rounded to x's dtype, and a kernel may take rstd from the rounded sum (Liger) or from the
# float32 sum before it rounds (quack). The float64 reference has no rounding there, so rstd is
# judged against the native reference (which rounds the sum) within what that rounding can move it:
# each element of the sum moves by at most half its dtype's unit roundoff u, so mean(s^2), and with
# it rstd, by about u at most (2^-8 bfloat16, 2^-11 float16); float32 inputs keep the oracle's rule
# for two native computations (its float32 rtol times NATIVE_WIDEN).
_SUM_RTOL = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def _rstd_within_sum_rounding(got, want, inputs):
    rtol = max(_SUM_RTOL.get(inputs["x"].dtype, 0.0), oracle.rtol_for(torch.float32) * oracle.NATIVE_WIDEN)
    return oracle.compare(got["rstd"], want["rstd"], what="against the rounded sum's", rtol=rtol).problem


@kg.op("kglib::add_rmsnorm", impls=IMPLS, sample_inputs=sample_inputs,
       dtypes=(torch.float32, torch.float16, torch.bfloat16), outputs=("out", "summed", "rstd"),
       compare={"rstd": _rstd_within_sum_rounding})
def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rmsnorm(s) * weight, s, rstd) for s = x + residual rounded to x's dtype; rstd float32."""
    summed = x + residual
    sf = summed.float()
    rstd = torch.rsqrt(sf.pow(2).mean(-1) + eps)
    return (sf * rstd.unsqueeze(-1) * weight.float()).to(x.dtype), summed, rstd
