"""Rotary position embedding applied in place to q and k (the Llama/HF "rotate half" form), with
Liger-Kernel's Triton kernel and PyTorch as candidates. q is (batch, seq, q_heads, head_dim), k
(batch, seq, kv_heads, head_dim), cos and sin (1 or batch, seq, head_dim)."""

from __future__ import annotations

import torch

import kernelgraft as kg

from . import _liger

IMPLS = [_liger.rope]


def _angles(batch, seq, dim, device, dtype):
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    pos = torch.arange(seq, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([pos, pos], dim=-1)[None].expand(batch, seq, dim).contiguous()
    return emb.cos().to(dtype), emb.sin().to(dtype)


def sample_inputs(device: str = "cpu", dtype: torch.dtype = torch.float32):
    for batch, seq, qh, kh, dim, cos_batch in [(1, 3, 4, 2, 8, 1), (2, 5, 8, 8, 16, 2), (2, 7, 6, 2, 64, 1)]:
        cos, sin = _angles(cos_batch, seq, dim, device, dtype)
        yield (torch.randn(batch, seq, qh, dim, device=device, dtype=dtype),
               torch.randn(batch, seq, kh, dim, device=device, dtype=dtype), cos, sin)
    for dt in (torch.float16, torch.bfloat16):
        cos, sin = _angles(1, 9, 128, device, dt)
        yield (torch.randn(1, 9, 8, 128, device=device, dtype=dt), torch.randn(1, 9, 2, 128, device=device, dtype=dt),
               cos, sin)


BENCH_SHAPES = {
    "short": {"prefill": [(1, 4096, 32, 8, 128)]},
    "llm": {"decode": [(16, 1, 32, 8, 128)], "prefill": [(1, 4096, 32, 8, 128), (4, 8192, 32, 8, 128)]},
}


def bench_case(batch, seq, qh, kh, dim, device: str = "cuda"):
    """q and k of (batch, seq, heads, dim) in bf16 with their cos and sin: one shape of ``BENCH_SHAPES``."""
    cos, sin = _angles(1, seq, dim, device, torch.bfloat16)
    return (torch.randn(batch, seq, qh, dim, device=device, dtype=torch.bfloat16),
            torch.randn(batch, seq, kh, dim, device=device, dtype=torch.bfloat16), cos, sin)


def _rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = t.shape[-1] // 2
    rotated = torch.cat([-t[..., half:], t[..., :half]], dim=-1)
    return t * cos[:, :, None, :] + rotated * sin[:, :, None, :]


@kg.op("kglib::rope_", impls=IMPLS, sample_inputs=sample_inputs, mutates_args=("q", "k"),
       dtypes=(torch.float32, torch.float16, torch.bfloat16))
def rope_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """q, k <- q * cos + rotate_half(q) * sin (k likewise), in q's dtype."""
    q.copy_(_rotate(q, cos, sin))
    k.copy_(_rotate(k, cos, sin))
