"""A module-level op and a fake timer for the tuning-ahead tests (ranks import this module too).

The fake timings depend on the row count and the config, with ties, so different keys choose
different configs and a tie is broken by declaration order."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernelgraft as kg

LAST = {"n": 0}  # the size the last launch saw: what the fake timer reads


@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


def launch_scale(x, out, *, BLOCK):
    n = x.numel()
    LAST["n"] = n
    _scale_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)


CONFIGS = [{"BLOCK": 64}, {"BLOCK": 128}, {"BLOCK": 256}, {"BLOCK": 512}]


def fake_ms(n: int, block: int) -> float:
    """Small sizes: 256 and 512 tie (256 is declared first); mid sizes: 128 and 256 tie; large: 512."""
    if n < 64:
        return {64: 4.0, 128: 3.0, 256: 2.0, 512: 2.0}[block]
    if n < 1024:
        return {64: 5.0, 128: 1.0, 256: 1.0, 512: 3.0}[block]
    return {64: 6.0, 128: 3.0, 256: 2.0, 512: 1.0}[block]


def fake_timer(trial, settings):
    trial.run(0)
    return fake_ms(LAST["n"], trial.candidate.config.as_dict()["BLOCK"])


def _scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _scale2(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def sample_inputs(device: str = "cpu"):
    return [(torch.randn(100, device=device),)]


scale = kg.op(_scale, name="tpre::scale", impls=[kg.triton(launch_scale, configs=CONFIGS)],
              sample_inputs=sample_inputs)
scale2 = kg.op(_scale2, name="tpre::scale2", impls=[kg.triton(launch_scale, configs=CONFIGS)],
               sample_inputs=sample_inputs)
