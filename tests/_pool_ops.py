"""Module-level ops for the compile-pool tests: a compile worker imports this module to find them."""

from __future__ import annotations

import os
import time

import torch
import triton
import triton.language as tl

import kernelgraft as kg


@triton.jit
def _axpy_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, alpha * x + y, mask=mask)


def launch_axpy(x, y, alpha, out, *, BLOCK, num_warps=4):
    n = x.numel()
    _axpy_kernel[(triton.cdiv(n, BLOCK),)](x, y, out, n, alpha, BLOCK=BLOCK, num_warps=num_warps)


_CUDA_AXPY = r"""
template <typename T>
__global__ void axpy(const T* x, const T* y, T* out, float alpha, int n) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) out[i] = T(alpha * float(x[i]) + float(y[i]));
}
"""


def launch_axpy_cuda(x, y, alpha, out, *, BLOCK):
    n = x.numel()
    return kg.Launch(grid=((n + BLOCK - 1) // BLOCK,), block=BLOCK,
                     args=(x, y, out, kg.driver.f32(alpha), kg.driver.i32(n)),
                     template={"T": kg.ctype(x.dtype)})


@kg.op("tpool::axpy", impls=[
    kg.triton(launch_axpy, configs=[{"BLOCK": 128}, {"BLOCK": 256, "num_warps": 2}]),
    kg.cuda(_CUDA_AXPY, "axpy<{T}>", launch=launch_axpy_cuda, configs=[{"BLOCK": 128}, {"BLOCK": 256}]),
])
def axpy(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return alpha * x + y


def launch_die(x, out, *, BLOCK):
    import os

    os._exit(3)  # what a compiler crash does to the process compiling


@kg.op("tpool::die", impls=[kg.triton(launch_die, configs=[{"BLOCK": 64}, {"BLOCK": 128}])])
def die(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


# A meeting of compile workers: each compile of ``tpool::meet`` waits (at most ``MEET_S``) until
# that many distinct worker processes have reached one. A worker compiles one job at a time, so a
# test that sends a pool of N workers N meet jobs knows every worker took one: a worker that never
# got a job leaves the others waiting, and their jobs fail saying so.
MEET = "KERNELGRAFT_TEST_MEET"  # "<count>:<directory>"; unset: no waiting
MEET_S = 120.0


def meet_here() -> None:
    """Leave this process's pid in the meeting's directory and wait for the others' (a bound, not a
    measurement: what is asserted is who came)."""
    text = os.environ.get(MEET)
    if not text:
        return
    count, where = text.split(":", 1)
    with open(os.path.join(where, str(os.getpid())), "w"):
        pass
    deadline = time.monotonic() + MEET_S
    while len(here := os.listdir(where)) < int(count):
        if time.monotonic() > deadline:
            raise TimeoutError(f"only worker(s) {sorted(here)} of {count} met in {MEET_S:.0f} s: "
                               "the others never took a job")
        time.sleep(0.01)


def launch_meet(x, y, alpha, out, *, BLOCK, num_warps=4):
    meet_here()
    launch_axpy(x, y, alpha, out, BLOCK=BLOCK, num_warps=num_warps)


@kg.op("tpool::meet", impls=[kg.triton(launch_meet, configs=[{"BLOCK": 64}, {"BLOCK": 512}])])
def meet(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return alpha * x + y
