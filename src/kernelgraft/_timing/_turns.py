"""CUDA-graph replays taken in turn: the timing that compares several candidates at one clock.

Timed one after the other, each over tens of milliseconds, two runs of the very same cuBLAS GEMM
read 259 and 327 us within one round on the H200 (benchmarks/results/2026-12-02-h200-s13): its
clock under a GEMM's power draw moves over milliseconds to seconds. Replays taken in turn (one
replay of each graph, about a millisecond of work each, then the next turn, in orders where each
graph follows each other one equally often) run back to back on the GPU and see the same clock to
within a millisecond, so the ratio of two medians is the ratio of the work. The bench (``measure_interleaved``) and the tuner
(its finalists) both time this way.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

__all__ = ["balanced_orders", "replay_in_turn"]


def balanced_orders(n: int) -> list[list[int]]:
    """Orders of ``n`` things in which each one comes straight after each other one equally often
    (a Williams design: ``n`` orders for even ``n``, ``2n`` for odd). A timed call pays for what
    the call before it left behind (garbage to collect, a GPU queue to drain, the L2's contents):
    in a one-token Llama decode on the H200 two copies of one compiled model read 4.3% apart over
    4000 turns when the order only rotated, so that one always followed an eager forward and the
    other a compiled one (benchmarks/results/2026-12-02-h200-s14)."""
    if n <= 1:
        return [list(range(n))]
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    orders = [[(x + r) % n for x in first] for r in range(n)]
    return orders if n % 2 == 0 else orders + [o[::-1] for o in orders]


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
    orders = balanced_orders(n)
    for r in range(reps):
        for j in orders[r % len(orders)]:
            s, e = events[r][j]
            s.record()
            graphs[j][0].replay()
            e.record()
    torch.cuda.synchronize(device)
    return [[events[r][j][0].elapsed_time(events[r][j][1]) / graphs[j][1] for r in range(reps)]
            for j in range(n)]
