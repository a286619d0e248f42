"""A module-level op whose module records each import (the compile-zygote preload test): the pid
of every process importing it is appended to the file ``KERNELGRAFT_TEST_PRELOAD_LOG`` names."""

from __future__ import annotations

import os

import torch

import kernelgraft as kg
from _pool_ops import launch_axpy

_log = os.environ.get("KERNELGRAFT_TEST_PRELOAD_LOG")
if _log:
    with open(_log, "a") as f:
        f.write(f"{os.getpid()}\n")


@kg.op("tpreload::axpy", impls=[kg.triton(launch_axpy, configs=[{"BLOCK": 128}, {"BLOCK": 256, "num_warps": 2}])])
def axpy(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return alpha * x + y
