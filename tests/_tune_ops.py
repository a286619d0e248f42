"""Ops and a fake timer for the tuner's CPU tests (importable by spawned processes)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernelgraft as kg


@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * factor, mask=mask)


def launch_scale(x, out, *, BLOCK, BUG=False):
    n = x.numel()
    # BUG plants a wrong result: the factor is off, as a miscompiled config would be.
    _scale_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, 3.0 if BUG else 2.0, BLOCK=BLOCK)


def launch_crash(x, out, *, BLOCK):
    raise RuntimeError("simulated launch failure")


CONFIGS = [{"BLOCK": 64}, {"BLOCK": 128}, {"BLOCK": 256}, {"BLOCK": 512}]

# Fake timings (ms) by BLOCK: 256 is the fastest correct config, BUG is faster still.
FAKE_MS = {64: 4.0, 128: 3.0, 256: 1.0, 512: 2.0}


def fake_timer(trial, settings):
    cfg = trial.candidate.config.as_dict()
    if cfg.get("BUG"):
        return 0.1
    trial.run(0)
    return FAKE_MS[cfg["BLOCK"]]


def make_scale(name: str, *, bug: bool = False, crash: bool = False, prune=None, buckets=None):
    impls = [kg.triton(launch_scale, configs=CONFIGS + ([{"BLOCK": 1024, "BUG": True}] if bug else []))]
    if crash:
        impls.append(kg.triton(launch_crash, configs=[{"BLOCK": 32}]))

    def scale(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    return kg.op(scale, name=name, impls=impls, prune=prune, buckets=buckets)


def launch_die(x, out, *, BLOCK):
    import os

    os._exit(3)  # what a candidate that corrupts the CUDA context does to its process


def scale_isolated(x: torch.Tensor) -> torch.Tensor:
    return x * 2


ISOLATED = kg.op(scale_isolated, name="tiso::scale", impls=[
    kg.triton(launch_scale, configs=CONFIGS[:2]),
    kg.triton(launch_die, configs=[{"BLOCK": 32}]),
    kg.triton(launch_scale, configs=[{"BLOCK": 256}], name="last"),
])
