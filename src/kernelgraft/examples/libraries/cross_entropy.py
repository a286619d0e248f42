"""Per-row cross-entropy loss (no reduction, ignore_index -100) from logits, with quack's CuTe DSL
kernel and PyTorch as candidates."""

from __future__ import annotations

import torch

import kernelgraft as kg

from . import _quack

IMPLS = [_quack.cross_entropy]


def sample_inputs(device: str = "cpu", dtype: torch.dtype = torch.float32):
    for rows, vocab in [(1, 8), (5, 64), (3, 1000), (17, 4096), (4, 320)]:
        target = torch.randint(0, vocab, (rows,), device=device)
        target[0] = -100  # ignored: loss 0
        yield (torch.randn(rows, vocab, device=device, dtype=dtype) * 3, target)
    for dt in (torch.float16, torch.bfloat16):
        yield (torch.randn(9, 768, device=device, dtype=dt) * 3, torch.randint(0, 768, (9,), device=device))


BENCH_SHAPES = {
    "short": {"vocab": [(4096, 32000)]},
    "llm": {"vocab": [(1024, 32000), (4096, 32000), (1024, 128256), (4096, 128256)]},
}


def bench_case(rows, vocab, device: str = "cuda"):
    return (
        torch.randn(rows, vocab, device=device, dtype=torch.bfloat16),
        torch.randint(0, vocab, (rows,), device=device))


@kg.op("kglib::cross_entropy", impls=IMPLS, sample_inputs=sample_inputs,
       dtypes={"logits": (torch.float32, torch.float16, torch.bfloat16), "target": (torch.int64, torch.int32)})
def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """loss[i] = logsumexp(logits[i]) - logits[i, target[i]] in float32; 0 where target is -100."""
    return torch.nn.functional.cross_entropy(logits.float(), target, reduction="none", ignore_index=-100)
