"""RMSNorm with a fused residual add, as in every pre-norm transformer block.

Semantics (those of Hugging Face models, which the graft replaces):

    residual_out = x + residual                      # rounded to x's dtype, like ``h = h + residual``
    out = rmsnorm(residual_out) * weight             # statistics in float32, stored in x's dtype
    return out, residual_out

vLLM's ``fused_add_rms_norm`` and TensorRT-LLM's fused residual norms compute the same values but
write them into ``x`` and ``residual`` in place. This op is functional instead (two fresh outputs):
that keeps ``torch.compile``/``torch.export`` free of mutation bookkeeping and lets the tuner rerun
candidates on the same inputs. The normalisation uses the *rounded* sum, so the output equals
running the unfused ``x + residual`` then RMSNorm in the model's dtype.

>>> import torch
>>> from kernelgraft.examples.rmsnorm_residual import rmsnorm_residual
>>> x, r, w = torch.randn(4, 64), torch.randn(4, 64), torch.ones(64)
>>> out, res = rmsnorm_residual(x, r, w, 1e-6)
>>> torch.equal(res, x + r)
True
>>> torch.allclose(out, res * torch.rsqrt(res.pow(2).mean(-1, keepdim=True) + 1e-6))
True
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernelgraft as kg

from ._special import nan_inf


@triton.jit
def _rmsnorm_residual_kernel(
    x_ptr, r_ptr, w_ptr, eps, out_ptr, res_ptr, n_rows, n_cols,
    ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    r = tl.load(r_ptr + offs, mask=mask, other=0.0)
    s = (x.to(tl.float32) + r.to(tl.float32)).to(res_ptr.dtype.element_ty)
    tl.store(res_ptr + offs, s, mask=mask)
    sf = s.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(sf * sf, axis=1) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    y = sf * rstd[:, None] * w[None, :]
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def launch_rmsnorm_residual(x, residual, weight, eps, out, residual_out, *, rows_per_program, num_warps):
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols if n_cols else 0
    block = triton.next_power_of_2(max(n_cols, 1))
    grid = (triton.cdiv(n_rows, rows_per_program),)
    _rmsnorm_residual_kernel[grid](
        x, residual, weight, eps, out, residual_out, n_rows, n_cols,
        ROWS=rows_per_program, BLOCK=block, num_warps=num_warps,
    )


def _fits(x, residual, weight, eps, *, rows_per_program=1, **config):
    if residual.shape != x.shape:
        return f"residual shape {tuple(residual.shape)} differs from x's {tuple(x.shape)}"
    if residual.dtype != x.dtype:
        return f"residual dtype {residual.dtype} differs from x's {x.dtype}"
    if weight.shape != x.shape[-1:]:
        return f"weight shape {tuple(weight.shape)} does not match x's last dim {x.shape[-1]}"
    if x.dim() == 0 or x.shape[-1] == 0:
        return "x needs a non-empty last dimension"
    tile = rows_per_program * triton.next_power_of_2(x.shape[-1])
    if tile > 32768:
        return f"{rows_per_program} rows of {x.shape[-1]} elements exceed this config's tile of 32768"
    return True


TRITON = kg.triton(
    launch_rmsnorm_residual,
    configs=[
        {"rows_per_program": 1, "num_warps": 4},
        {"rows_per_program": 1, "num_warps": 8},
        {"rows_per_program": 1, "num_warps": 16},
        {"rows_per_program": 4, "num_warps": 4},
        {"rows_per_program": 16, "num_warps": 8},
    ],
    supports=_fits,
)

_CUDA_SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
// One block of THREADS threads per row. Pass 1 writes the rounded sum and reduces its squares in
// float32; pass 2 re-reads that sum (just written by this block, so from L2) and normalises.
template <typename T>
__global__ void rmsnorm_residual(const T* __restrict__ x, const T* __restrict__ r,
                                 const T* __restrict__ w, T* __restrict__ out,
                                 T* __restrict__ res_out, int n_cols, float eps) {
    const long long base = (long long)blockIdx.x * n_cols;
    float acc = 0.0f;
    for (int c = threadIdx.x; c < n_cols; c += THREADS) {
        T s = (T)((float)x[base + c] + (float)r[base + c]);
        res_out[base + c] = s;
        float f = (float)s;
        acc += f * f;
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
        out[base + c] = (T)((float)res_out[base + c] * rstd * (float)w[c]);
}
"""


def launch_rmsnorm_residual_cuda(x, residual, weight, eps, out, residual_out, *, THREADS):
    n_cols = x.shape[-1]
    rows = x.numel() // n_cols if n_cols else 0
    return kg.Launch(
        grid=rows,
        block=THREADS,
        args=(x, residual, weight, out, residual_out, kg.driver.i32(n_cols), kg.driver.f32(eps)),
        template={"T": kg.ctype(x.dtype)},
    )


def _fits_cuda(x, residual, weight, eps, **config):
    if weight.dtype != x.dtype:
        return f"the CUDA kernel takes weight in x's dtype {x.dtype}, got {weight.dtype}"
    return _fits(x, residual, weight, eps)


CUDA = kg.cuda(
    _CUDA_SOURCE,
    "rmsnorm_residual<{T}>",
    launch=launch_rmsnorm_residual_cuda,
    configs=[{"THREADS": 128}, {"THREADS": 256}, {"THREADS": 1024}],
    supports=_fits_cuda,
)

IMPLS = [TRITON, CUDA]


def sample_inputs(device: str = "cpu", dtype: torch.dtype = torch.float32):
    """Edge shapes for ``kernelgraft check``: a single element, odd widths, 3-d inputs."""
    for rows, cols in [(1, 1), (1, 7), (5, 64), (3, 1000), (17, 4096), (33, 131)]:
        yield (
            torch.randn(rows, cols, device=device, dtype=dtype),
            torch.randn(rows, cols, device=device, dtype=dtype),
            torch.randn(cols, device=device, dtype=dtype),
            1e-6,
        )
    yield (
        torch.randn(2, 3, 256, device=device, dtype=dtype),
        torch.randn(2, 3, 256, device=device, dtype=dtype),
        torch.randn(256, device=device, dtype=dtype),
        1e-5,
    )
    for dt in (torch.float16, torch.bfloat16):
        yield (
            torch.randn(9, 768, device=device, dtype=dt),
            torch.randn(9, 768, device=device, dtype=dt),
            torch.randn(768, device=device, dtype=dt),
            1e-6,
        )
        yield (
            nan_inf(torch.randn(4, 48, device=device, dtype=dt)),
            torch.randn(4, 48, device=device, dtype=dt),
            torch.randn(48, device=device, dtype=dt),
            1e-6,
        )


# Shapes for ``kernelgraft bench`` (kernelgraft.bench.suite): (tokens, hidden) bf16 x and residual.
BENCH_SHAPES = {
    "short": {"prefill": [(64, 4096), (512, 4096), (2048, 4096), (8192, 4096), (32768, 4096)]},
    "llm": {
        "decode": [(1, 4096), (16, 4096), (64, 8192)],
        "prefill": [(4096, 4096), (16384, 4096), (32768, 4096)],
        "wide": [(64, 16384), (4096, 16384), (16384, 8192), (32768, 8192)],
    },
}


def _bench_case(rows, cols, device="cuda"):
    return (
        torch.randn(rows, cols, device=device, dtype=torch.bfloat16),
        torch.randn(rows, cols, device=device, dtype=torch.bfloat16),
        torch.randn(cols, device=device, dtype=torch.bfloat16),
        1e-6,
    )


def bench_case(rows, cols, device: str = "cuda"):
    """Benchmark shapes: tokens x hidden in bf16, by regime (decode batch to 2^28 elements): the inputs of
    one shape of ``BENCH_SHAPES``."""
    return _bench_case(rows, cols, device)


def add_rmsnorm_pattern(x, residual, weight, eps):
    """What ``kg.graft(model, pattern=add_rmsnorm_pattern, replacement=rmsnorm_residual)`` looks
    for: a residual add and the RMSNorm of its sum, spelled as Hugging Face's Llama writes them
    (the norm's weight multiplies after the cast back). Returns (norm, sum), as the op does."""
    h = x + residual
    hf = h.to(torch.float32)
    hf = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * hf.to(h.dtype), h


@kg.op(
    "kgexamples::rmsnorm_residual",
    impls=IMPLS,
    sample_inputs=sample_inputs,
    dtypes=(torch.float32, torch.float16, torch.bfloat16),
)
def rmsnorm_residual(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(x + residual) * weight, x + residual); the sum is rounded to x's dtype first."""
    summed = x + residual
    sf = summed.float()
    out = sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return out.to(x.dtype), summed
