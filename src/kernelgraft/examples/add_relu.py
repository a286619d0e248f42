"""relu(x + y): the smallest useful elementwise op.

>>> import torch
>>> from kernelgraft.examples.add_relu import add_relu
>>> x, y = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 1.0])
>>> add_relu(x, y).tolist()
[1.5, 0.0]
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernelgraft as kg

from ._elementwise import launch_binary_cuda
from ._special import nan_inf


@triton.jit
def _add_relu_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    # Sum in float32 and round once; this also keeps Triton's CPU interpreter exact for bfloat16.
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask).to(tl.float32)
    s = x + y
    # relu as torch computes it: NaN and -0.0 pass through (tl.maximum would turn NaN into 0).
    tl.store(out_ptr + offsets, tl.where(s < 0.0, 0.0, s).to(out_ptr.dtype.element_ty), mask=mask)


def launch_add_relu(x, y, out, *, BLOCK, num_warps):
    n = x.numel()
    _add_relu_kernel[(triton.cdiv(n, BLOCK),)](x, y, out, n, BLOCK=BLOCK, num_warps=num_warps)


def _same_shape(x, y, **config):
    return True if x.shape == y.shape else f"shapes differ: {tuple(x.shape)} vs {tuple(y.shape)}"


TRITON = kg.triton(
    launch_add_relu,
    configs=[
        {"BLOCK": 1024, "num_warps": 4},
        {"BLOCK": 4096, "num_warps": 8},
        {"BLOCK": 256, "num_warps": 2},
    ],
    supports=_same_shape,
)

_CUDA_SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
// BLOCK threads per block, each handling ITEMS elements BLOCK apart (coalesced).
template <typename T>
__global__ void add_relu(const T* __restrict__ x, const T* __restrict__ y, T* __restrict__ out,
                         long long n) {
    long long base = (long long)blockIdx.x * BLOCK * ITEMS + threadIdx.x;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        long long i = base + (long long)k * BLOCK;
        if (i < n) {
            float s = (float)x[i] + (float)y[i];
            out[i] = (T)(s < 0.0f ? 0.0f : s);  // NaN and -0.0 pass through, as torch.relu; fmaxf drops NaN
        }
    }
}
"""


CUDA = kg.cuda(
    _CUDA_SOURCE,
    "add_relu<{T}>",
    launch=launch_binary_cuda,
    configs=[{"BLOCK": 256, "ITEMS": 4}, {"BLOCK": 512, "ITEMS": 2}],
    supports=_same_shape,
)

IMPLS = [TRITON, CUDA]

# cuTile and CuTe DSL versions join when those packages are installed (examples/_cute_kernels.py).
from ._cute_kernels import CUTEDSL_IMPLS, CUTILE_IMPLS  # noqa: E402

IMPLS += [impls['add_relu'] for impls in (CUTILE_IMPLS, CUTEDSL_IMPLS) if 'add_relu' in impls]


def sample_inputs(device: str = "cpu", dtype: torch.dtype = torch.float32):
    """Shapes for ``kernelgraft check``: edge sizes, primes, non-multiples of every block."""
    for shape in [(1,), (7,), (257,), (1000,), (4097,), (3, 5, 11), (128, 1024)]:
        yield (
            torch.randn(shape, device=device, dtype=dtype),
            torch.randn(shape, device=device, dtype=dtype),
        )
    for dt in (torch.float16, torch.bfloat16):
        yield (torch.randn(33, 97, device=device, dtype=dt), torch.randn(33, 97, device=device, dtype=dt))
        yield (nan_inf(torch.randn(5, 33, device=device, dtype=dt)), torch.randn(5, 33, device=device, dtype=dt))


# Shapes for ``kernelgraft bench`` (kernelgraft.bench.suite): flat bf16 element counts.
BENCH_SHAPES = {
    "short": {"elementwise": [(1 << 16,), (1 << 20,), (1 << 24,), (1 << 28,)]},
    "llm": {"elementwise": [(4096,), (64 * 4096,), (4096 * 4096,), (32768 * 8192,)]},
}


def bench_case(n, device: str = "cuda"):
    """Sizes for ``kernelgraft bench``: 2^12 to 2^28 bf16 elements (the largest fill the H200): the inputs
    of one shape of ``BENCH_SHAPES``."""
    return (torch.randn(n, device=device, dtype=torch.bfloat16),
            torch.randn(n, device=device, dtype=torch.bfloat16))


@kg.op(
    "kgexamples::add_relu",
    impls=IMPLS,
    sample_inputs=sample_inputs,
    dtypes=(torch.float32, torch.float16, torch.bfloat16),
)
def add_relu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """relu(x + y), elementwise, same shape and dtype."""
    return torch.relu(x + y)
