"""RMSNorm over the last dimension: ``x / sqrt(mean(x^2) + eps) * weight``, computed in float32.

>>> import torch
>>> from kernelgraft.examples.rmsnorm import rmsnorm
>>> x, w = torch.randn(4, 64), torch.ones(64)
>>> torch.allclose(rmsnorm(x, w, 1e-6), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
True
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernelgraft as kg

from ._special import nan_inf


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    y = x * rstd * w
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def launch_rmsnorm(x, weight, eps, out, *, num_warps, min_block):
    n_cols = x.shape[-1]
    rows = x.numel() // n_cols if n_cols else 0
    block = max(min_block, triton.next_power_of_2(n_cols))
    _rmsnorm_kernel[(rows,)](x, weight, out, n_cols, eps, BLOCK=block, num_warps=num_warps)


def _fits(x, weight, eps, **config):
    if weight.shape != x.shape[-1:]:
        return f"weight shape {tuple(weight.shape)} does not match x's last dim {x.shape[-1]}"
    if x.shape[-1] > 65536:
        return f"rows of {x.shape[-1]} elements exceed the single-pass limit of 65536"
    return True


TRITON = kg.triton(
    launch_rmsnorm,
    configs=[
        {"num_warps": 4, "min_block": 16},
        {"num_warps": 8, "min_block": 16},
        {"num_warps": 16, "min_block": 1024},
    ],
    supports=_fits,
)

@triton.jit
def _rmsnorm_rows_kernel(x_ptr, w_ptr, out_ptr, n_rows, n_cols, eps, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # ROWS rows per program: a row of 64-256 elements is too little work for a program of its
    # own (per-head QK norm launches tens of thousands of them), as Liger-Kernel's block kernel does.
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    y = x * rstd[:, None] * w[None, :]
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def launch_rmsnorm_rows(x, weight, eps, out, *, rows_per_program, num_warps):
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols if n_cols else 0
    block = triton.next_power_of_2(max(n_cols, 1))
    _rmsnorm_rows_kernel[(triton.cdiv(n_rows, rows_per_program),)](
        x, weight, out, n_rows, n_cols, eps, ROWS=rows_per_program, BLOCK=block, num_warps=num_warps
    )


ROWS_TILE = 8192  # elements per program (rows x padded width): 64 fp32 registers a thread at 4 warps


def _fits_rows(x, weight, eps, *, rows_per_program=1, **config):
    """Narrow rows only: a block of rows must fit one program's tile, and a row wider than 1024
    elements already gives one program enough work (the one-row kernels serve it)."""
    if weight.shape != x.shape[-1:]:
        return f"weight shape {tuple(weight.shape)} does not match x's last dim {x.shape[-1]}"
    width = triton.next_power_of_2(max(x.shape[-1], 1))
    if x.shape[-1] > 1024 or rows_per_program * width > ROWS_TILE:
        return (f"{rows_per_program} rows of {x.shape[-1]} elements exceed this config's tile of {ROWS_TILE} "
                "(the block-of-rows kernel serves rows of at most 1024 elements)")
    return True


TRITON_ROWS = kg.triton(
    launch_rmsnorm_rows,
    configs=[
        {"rows_per_program": 4, "num_warps": 4},
        {"rows_per_program": 16, "num_warps": 4},
        {"rows_per_program": 32, "num_warps": 8},
        {"rows_per_program": 64, "num_warps": 8},
    ],
    supports=_fits_rows,
    name="rmsnorm_rows",
)

_CUDA_SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
// One block of THREADS threads per row; float32 sum of squares reduced with warp shuffles.
template <typename T>
__global__ void rmsnorm(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ out,
                        int n_cols, float eps) {
    const T* xr = x + (long long)blockIdx.x * n_cols;
    T* outr = out + (long long)blockIdx.x * n_cols;
    float acc = 0.0f;
    for (int c = threadIdx.x; c < n_cols; c += THREADS) {
        float v = (float)xr[c];
        acc += v * v;
    }
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    __shared__ float partial[THREADS / 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        acc = lane < THREADS / 32 ? partial[lane] : 0.0f;
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (lane == 0) partial[0] = acc;
    }
    __syncthreads();
    const float rstd = rsqrtf(partial[0] / (float)n_cols + eps);
    for (int c = threadIdx.x; c < n_cols; c += THREADS)
        outr[c] = (T)((float)xr[c] * rstd * (float)w[c]);
}
"""


def _fits_cuda(x, weight, eps, **config):
    if weight.dtype != x.dtype:
        return f"the CUDA kernel takes weight in x's dtype {x.dtype}, got {weight.dtype}"
    return _fits(x, weight, eps, **config)


def launch_rmsnorm_cuda(x, weight, eps, out, *, THREADS):
    n_cols = x.shape[-1]
    rows = x.numel() // n_cols if n_cols else 0
    return kg.Launch(
        grid=rows,
        block=THREADS,
        args=(x, weight, out, kg.driver.i32(n_cols), kg.driver.f32(eps)),
        template={"T": kg.ctype(x.dtype)},
    )


CUDA = kg.cuda(
    _CUDA_SOURCE,
    "rmsnorm<{T}>",
    launch=launch_rmsnorm_cuda,
    configs=[{"THREADS": 128}, {"THREADS": 256}, {"THREADS": 1024}],
    supports=_fits_cuda,
)

IMPLS = [TRITON, CUDA, TRITON_ROWS]

# cuTile and CuTe DSL versions join when those packages are installed (examples/_cute_kernels.py).
from ._cute_kernels import CUTEDSL_IMPLS, CUTILE_IMPLS  # noqa: E402

IMPLS += [impls['rmsnorm'] for impls in (CUTILE_IMPLS, CUTEDSL_IMPLS) if 'rmsnorm' in impls]


def sample_inputs(device: str = "cpu", dtype: torch.dtype = torch.float32):
    # (70, 64) and (33, 128): narrow rows over several blocks of rows, the last one partial
    for rows, cols in [(1, 1), (1, 7), (5, 64), (3, 1000), (17, 4096), (2, 131), (70, 64), (33, 128)]:
        yield (
            torch.randn(rows, cols, device=device, dtype=dtype),
            torch.randn(cols, device=device, dtype=dtype),
            1e-6,
        )
    yield (torch.randn(2, 3, 256, device=device), torch.randn(256, device=device), 1e-5)
    for dt in (torch.float16, torch.bfloat16):
        yield (torch.randn(9, 768, device=device, dtype=dt), torch.randn(768, device=device, dtype=dt), 1e-6)
        yield (nan_inf(torch.randn(4, 48, device=device, dtype=dt)), torch.randn(48, device=device, dtype=dt), 1e-6)


# Shapes for ``kernelgraft bench`` (kernelgraft.bench.suite): (rows, hidden) bf16 activations.
BENCH_SHAPES = {
    "short": {"prefill": [(512, 4096), (4096, 4096), (16384, 4096), (32768, 8192)]},
    "llm": {
        "decode": [(1, 4096), (16, 4096), (64, 8192)],
        "prefill": [(4096, 4096), (16384, 4096), (32768, 4096)],
        # per-head QK norm: tokens x heads rows of head_dim
        "narrow": [(32768, 64), (65536, 128), (262144, 128), (65536, 256)],
        "wide": [(64, 16384), (4096, 16384), (16384, 8192), (32768, 8192)],
    },
}


def _bench_case(rows, cols, device="cuda"):
    return (
        torch.randn(rows, cols, device=device, dtype=torch.bfloat16),
        torch.randn(cols, device=device, dtype=torch.bfloat16),
        1e-6,
    )


def bench_case(rows, cols, device: str = "cuda"):
    """LLM-like (tokens, hidden) bf16 activations for ``kernelgraft bench``, by regime: the inputs of one
    shape of ``BENCH_SHAPES``."""
    return _bench_case(rows, cols, device)


@kg.op(
    "kgexamples::rmsnorm",
    impls=IMPLS,
    sample_inputs=sample_inputs,
    dtypes=(torch.float32, torch.float16, torch.bfloat16),
)
def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, accumulated in float32, returned in x's dtype."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)
