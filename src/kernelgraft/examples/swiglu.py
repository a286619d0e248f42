"""SwiGLU gate: ``silu(gate) * up``, elementwise, with a backward (usable in training grafts).

This is the activation inside Llama's MLP (``down_proj(act_fn(gate_proj(x)) * up_proj(x))``);
``kg.graft(model, pattern=swiglu_pattern, replacement=swiglu)`` replaces it in an unmodified model.

>>> import torch
>>> from kernelgraft.examples.swiglu import swiglu
>>> g, u = torch.tensor([0.0, 1.0]), torch.tensor([3.0, 2.0])
>>> [round(v, 4) for v in swiglu(g, u).tolist()]
[0.0, 1.4621]
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernelgraft as kg

from ._elementwise import launch_binary_cuda
from ._special import nan_inf


@triton.jit
def _swiglu_kernel(gate_ptr, up_ptr, out_ptr, n, BLOCK: tl.constexpr, F64: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    if F64:
        g = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float64)
        u = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float64)
    else:
        g = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


def launch_swiglu(gate, up, out, *, BLOCK, num_warps):
    n = gate.numel()
    f64 = gate.dtype == torch.float64
    _swiglu_kernel[(triton.cdiv(n, BLOCK),)](gate, up, out, n, BLOCK=BLOCK, F64=f64, num_warps=num_warps)


def _same_shape(gate, up, **config):
    if gate.shape != up.shape:
        return f"shapes differ: {tuple(gate.shape)} vs {tuple(up.shape)}"
    if gate.dtype != up.dtype:
        return f"dtypes differ: {gate.dtype} vs {up.dtype}"
    return True


TRITON = kg.triton(
    launch_swiglu,
    configs=[
        {"BLOCK": 1024, "num_warps": 4},
        {"BLOCK": 2048, "num_warps": 8},
        {"BLOCK": 256, "num_warps": 2},
    ],
    supports=_same_shape,
)

_CUDA_SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
template <typename T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };
// BLOCK threads per block, each handling ITEMS elements BLOCK apart (coalesced); math in float
// (double for double inputs), one rounding at the store.
template <typename T>
__global__ void swiglu(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ out,
                       long long n) {
    typedef typename Acc<T>::type A;
    long long base = (long long)blockIdx.x * BLOCK * ITEMS + threadIdx.x;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        long long i = base + (long long)k * BLOCK;
        if (i < n) {
            A g = (A)gate[i];
            out[i] = (T)(g / ((A)1 + exp(-g)) * (A)up[i]);
        }
    }
}
"""


CUDA = kg.cuda(
    _CUDA_SOURCE,
    "swiglu<{T}>",
    launch=launch_binary_cuda,
    configs=[{"BLOCK": 256, "ITEMS": 4}, {"BLOCK": 512, "ITEMS": 2}],
    supports=_same_shape,
)

IMPLS = [TRITON, CUDA]


def sample_inputs(device: str = "cpu", dtype: torch.dtype = torch.float32):
    """Shapes for ``kernelgraft check``: edge sizes, odd sizes, the MLP layout (tokens, intermediate)."""
    for shape in [(2, 8), (1,), (7,), (257,), (3, 5, 11), (4, 16, 352), (64, 1000)]:
        yield (
            torch.randn(shape, device=device, dtype=dtype) * 3,
            torch.randn(shape, device=device, dtype=dtype),
        )
    for dt in (torch.float16, torch.bfloat16):
        yield (torch.randn(33, 97, device=device, dtype=dt) * 3, torch.randn(33, 97, device=device, dtype=dt))
        yield (nan_inf(torch.randn(5, 33, device=device, dtype=dt)),
               nan_inf(torch.randn(5, 33, device=device, dtype=dt)))


# Shapes for ``kernelgraft bench`` (kernelgraft.bench.suite): (tokens, intermediate) bf16 gate
# and up; intermediate sizes of Llama-2 7B (11008), Llama-3 8B (14336), 70B (28672), 405B (53248).
BENCH_SHAPES = {
    "short": {"prefill": [(16, 4096), (1024, 11008), (8192, 11008), (32768, 14336)]},
    "llm": {
        "decode": [(1, 14336), (16, 14336), (64, 28672)],
        "prefill": [(4096, 14336), (16384, 14336), (32768, 14336)],
        "wide": [(4096, 28672), (16384, 53248)],
    },
}


def _bench_case(tokens, inter, device="cuda"):
    return (
        torch.randn(tokens, inter, device=device, dtype=torch.bfloat16) * 3,
        torch.randn(tokens, inter, device=device, dtype=torch.bfloat16),
    )


def bench_case(tokens, inter, device: str = "cuda"):
    """Sizes for ``kernelgraft bench``: (tokens, intermediate) bf16, decode to long prefill: the inputs of
    one shape of ``BENCH_SHAPES``."""
    return _bench_case(tokens, inter, device)


@kg.op(
    "kgexamples::swiglu",
    impls=IMPLS,
    sample_inputs=sample_inputs,
    dtypes=(torch.float32, torch.float16, torch.bfloat16, torch.float64),
)
def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, elementwise, same shape and dtype."""
    if gate.dtype != up.dtype:
        # torch would round silu(gate) in gate's dtype and then promote: a float32 result that
        # carries float16 error. One dtype, as the kernels take it.
        raise kg.InputError(f"kgexamples::swiglu: arguments 'gate' and 'up' must have one dtype, got "
                            f"gate {gate.dtype} and up {up.dtype}; convert one with .to()")
    return torch.nn.functional.silu(gate) * up


def swiglu_pattern(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """What ``kg.graft(..., pattern=swiglu_pattern, replacement=swiglu)`` looks for in a model."""
    return torch.nn.functional.silu(gate) * up


def _setup_context(ctx, inputs, output):
    gate, up = inputs
    ctx.save_for_backward(gate, up)


def _backward(ctx, grad):
    gate, up = ctx.saved_tensors
    g = gate.float() if gate.dtype in (torch.float16, torch.bfloat16) else gate
    sig = torch.sigmoid(g)
    silu = g * sig
    grad_f = grad.to(g.dtype)
    d_gate = grad_f * up.to(g.dtype) * sig * (1 + g * (1 - sig))
    d_up = grad_f * silu
    return d_gate.to(gate.dtype), d_up.to(up.dtype)


swiglu.register_autograd(_backward, setup_context=_setup_context)
