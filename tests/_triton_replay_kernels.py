"""Triton kernels for the native-replay GPU tests (Triton reads a kernel's source from its file):
an autotuned kernel with a float scalar, and a strided copy whose stride may specialise to 1."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernelgraft as kg


@triton.autotune(configs=[triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 512})], key=["n"])
@triton.jit
def _scale(x, out, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) * alpha, mask=m)


def launch_scale(x, alpha, out):
    n = x.numel()
    _scale[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n, alpha)


@triton.jit(do_not_specialize=["n"])
def _gather(x, out, n, stride, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs * stride, mask=m), mask=m)


def launch_gather(x, out, *, BLOCK):
    n = out.numel()
    _gather[(triton.cdiv(n, BLOCK),)](x, out, n, x.stride(0), BLOCK=BLOCK)


def ops():
    scale = kg.op("kgtest_native::tr_scale", impls=[kg.triton(launch_scale, configs=[{}])],
                  fallback="error", compete=False)(_scale_ref)
    gather = kg.op("kgtest_native::tr_gather", impls=[kg.triton(launch_gather, configs=[{"BLOCK": 256}],
                                                                contiguous=False)],
                   fallback="error", compete=False)(_gather_ref)
    return scale, gather


def _scale_ref(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * alpha


def _gather_ref(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().clone()
