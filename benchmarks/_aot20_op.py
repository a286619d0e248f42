"""An op with 20 Triton candidates (5 block sizes x 4 warp counts) for bench_aot_startup.py."""

import torch
import triton
import triton.language as tl

import kernelgraft as kg


@triton.jit
def _scale_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, tl.maximum(2.0 * x + y, 0.0).to(out_ptr.dtype.element_ty), mask=mask)


def launch(x, y, out, *, BLOCK, num_warps):
    n = x.numel()
    _scale_add_kernel[(triton.cdiv(n, BLOCK),)](x, y, out, n, BLOCK=BLOCK, num_warps=num_warps)


CONFIGS = [{"BLOCK": b, "num_warps": w} for b in (128, 256, 512, 1024, 2048) for w in (1, 2, 4, 8)]


def sample_inputs(device="cpu"):
    for n in (1 << 20, 1000):
        yield torch.randn(n, device=device), torch.randn(n, device=device)


@kg.op("kgbench::scale_add20", impls=[kg.triton(launch, configs=CONFIGS)], sample_inputs=sample_inputs)
def scale_add20(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """relu(2x + y) with 20 Triton candidates."""
    return torch.relu(2 * x + y)
