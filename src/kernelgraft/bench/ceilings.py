"""The device's practical ceilings, measured at the start of a run: copy bandwidth and bf16 GEMM.

Fractions in the report are of these measured numbers, not of datasheet peaks, so they say how
close a kernel gets to what this GPU, driver and torch build actually deliver.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from .timing import measure

__all__ = ["Ceilings", "measure_ceilings"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Ceilings:
    copy_gbps: float  # device-to-device copy, bytes read + bytes written per second / 1e9
    bf16_tflops: float  # torch.mm on square bf16 matrices
    copy_bytes: int = 0
    gemm_n: int = 0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def copy_bandwidth(device: torch.device | str = "cuda", nbytes: int = 1 << 30) -> float:
    """GB/s of ``dst.copy_(src)`` on ``nbytes`` buffers (counting the read and the write)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    t = measure(lambda: dst.copy_(src), device=device, cold_l2=False)
    return 2 * nbytes / (t.median_us * 1e-6) / 1e9


def gemm_tflops(device: torch.device | str = "cuda", n: int = 8192) -> float:
    """TFLOP/s of ``a @ b`` for n x n bf16 matrices."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    t = measure(lambda: torch.mm(a, b), device=device, cold_l2=False)
    return 2 * n**3 / (t.median_us * 1e-6) / 1e12


def measure_ceilings(device: torch.device | str = "cuda", *, copy_bytes: int = 1 << 30, gemm_n: int = 8192) -> Ceilings:
    copy = copy_bandwidth(device, copy_bytes)
    flops = gemm_tflops(device, gemm_n)
    log.info("ceilings: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s", copy, flops)
    return Ceilings(copy, flops, copy_bytes, gemm_n)
