"""Row softmax with candidates from quack (CuTe DSL), Liger-Kernel (Triton, its one-block and
multi-block kernels), kernelgraft's own Triton kernels and PyTorch."""

from __future__ import annotations

import torch

import kernelgraft as kg

from .. import softmax as _own
from .._special import nan_inf
from . import _liger, _quack

IMPLS = [_quack.softmax, _liger.softmax_single, _liger.softmax_multi, _own.TRITON_ROWS, _own.TRITON_ONLINE]


def sample_inputs(device: str = "cpu", dtype: torch.dtype = torch.float32):
    for rows, cols in [(1, 8), (5, 64), (3, 1000), (17, 4096), (2, 131)]:
        yield (torch.randn(rows, cols, device=device, dtype=dtype) * 4,)
    masked = torch.randn(4, 320, device=device, dtype=dtype)
    masked[:, 100:] = float("-inf")
    yield (masked,)
    for dt in (torch.float16, torch.bfloat16):
        yield (torch.randn(9, 768, device=device, dtype=dt),)
        yield (nan_inf(torch.randn(4, 320, device=device, dtype=dt)),)


BENCH_SHAPES = {
    "short": {"attention": [(512, 4096), (32768, 4096)], "vocab": [(16, 32000)]},
    "llm": {"attention": [(32, 4096), (4096, 4096), (32768, 1024), (32768, 4096)],
            "narrow": [(4096, 128), (32768, 128)], "vocab": [(1, 32000), (16, 32000), (64, 65536)]},
}


def bench_case(rows, cols, device: str = "cuda"):
    return (torch.randn(rows, cols, device=device, dtype=torch.bfloat16),)


@kg.op("kglib::softmax", impls=IMPLS, sample_inputs=sample_inputs,
       dtypes=(torch.float32, torch.float16, torch.bfloat16))
def softmax(x: torch.Tensor) -> torch.Tensor:
    """softmax(x, dim=-1) computed in float32, returned in x's dtype."""
    return torch.softmax(x.float(), dim=-1).to(x.dtype)
