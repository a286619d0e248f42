"""CUDA-graph replays taken in turn: the timing that compares several candidates at one clock.

Timed one after the other, each over tens of milliseconds, two runs of the very same cuBLAS GEMM
read 259 and 327 us within one round on the H200 (benchmarks/results/2026-12-02-h200-s13): its
clock under a GEMM's power draw moves over milliseconds to seconds. Replays taken in turn (one
replay of each graph, about a millisecond of work each, then the next turn, the order rotating by
one per turn) run back to back on the GPU and see the same clock to within a millisecond, so the
ratio of two medians is the ratio of the work. The bench (``measure_interleaved``) and the tuner
(its finalists) both time this way.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

__all__ = ["replay_in_turn"]


def replay_in_turn(graphs: "Sequence[tuple[torch.cuda.CUDAGraph, int]]", device: torch.device | None,
                   warmup_ms: float, rep_ms: float, min_reps: int, max_reps: int) -> list[list[float]]:
    """Per-call milliseconds of each ``(graph, calls in it)`` pair, one sample per turn: replays
    for ``warmup_ms`` of wall time (clocks up), then turns for about ``rep_ms`` of each graph's
    GPU time (at least ``min_reps``, at most ``max_reps`` turns). Runs on the current device
    (``device``: the one to synchronise)."""
    deadline = time.perf_counter() + warmup_ms / 1e3
    while time.perf_counter() < deadline:
        for graph, _ in graphs:
            graph.replay()
        torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for graph, _ in graphs:
        graph.replay()
    end.record()
    end.synchronize()
    turn_ms = max(start.elapsed_time(end), 1e-3)  # one replay of each
    n = len(graphs)
    reps = int(min(max_reps, max(min_reps, rep_ms * n / turn_ms)))
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
              for _ in range(reps)]
    for r in range(reps):
        for k in range(n):
            j = (r + k) % n
            s, e = events[r][j]
            s.record()
            graphs[j][0].replay()
            e.record()
    torch.cuda.synchronize(device)
    return [[events[r][j][0].elapsed_time(events[r][j][1]) / graphs[j][1] for r in range(reps)]
            for j in range(n)]
