"""Ranks of a torch.distributed test as spawned processes on this machine."""

from __future__ import annotations

import multiprocessing as mp

import pytest


def run_ranks(target, args_of, world: int = 2, timeout: float = 300, hung: str = "a rank hung") -> None:
    """Start ``target(*args_of(rank))`` for every rank (spawned: CUDA and fork do not mix), wait up
    to ``timeout`` seconds for each, and fail the test naming ``hung`` if one is still running,
    or with the exit code of one that failed."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=args_of(rank)) for rank in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
            pytest.fail(hung)
        assert p.exitcode == 0
