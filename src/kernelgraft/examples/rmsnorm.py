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

IMPLS = [TRITON, CUDA]

# cuTile and CuTe DSL versions join when those packages are installed (examples/_cute_kernels.py).
from ._cute_kernels import CUTEDSL_IMPLS, CUTILE_IMPLS  # noqa: E402

IMPLS += [impls['rmsnorm'] for impls in (CUTILE_IMPLS, CUTEDSL_IMPLS) if 'rmsnorm' in impls]


def sample_inputs(device: str = "cpu", dtype: torch.dtype = torch.float32):
    for rows, cols in [(1, 1), (1, 7), (5, 64), (3, 1000), (17, 4096), (2, 131)]:
        yield (
            torch.randn(rows, cols, device=device, dtype=dtype),
            torch.randn(cols, device=device, dtype=dtype),
            1e-6,
        )
    yield (torch.randn(2, 3, 256, device=device), torch.randn(256, device=device), 1e-5)
    for dt in (torch.float16, torch.bfloat16):
        yield (torch.randn(9, 768, device=device, dtype=dt), torch.randn(768, device=device, dtype=dt), 1e-6)
        yield (nan_inf(torch.randn(4, 48, device=device, dtype=dt)), torch.randn(48, device=device, dtype=dt), 1e-6)


def bench_inputs(device: str = "cuda"):
    """LLM-like (tokens, hidden) bf16 activations for ``kernelgraft bench``."""
    for rows, cols in ((512, 4096), (4096, 4096), (16384, 4096), (32768, 8192)):
        yield (
            torch.randn(rows, cols, device=device, dtype=torch.bfloat16),
            torch.randn(cols, device=device, dtype=torch.bfloat16),
            1e-6,
        )


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
