"""CUDA-graph replays taken in turn: the timing that compares several candidates at one clock.

Timed one after the other, each over tens of milliseconds, two runs of the very same cuBLAS GEMM
read 259 and 327 us within one round on the H200 (benchmarks/results/2026-12-02-h200-3): its
clock under a GEMM's power draw moves over milliseconds to seconds. Replays taken in turn (one
replay of each graph, about a millisecond of work each, then the next turn, in orders where each
graph follows each other one equally often, turn after turn) run back to back on the GPU and see
the same clock to within a millisecond, so the ratio of two medians is the ratio of the work. The
bench (``measure_interleaved``) and the tuner (its finalists) both time this way.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

import torch

__all__ = ["balanced_orders", "replay_in_turn", "whole_cycles"]


@functools.lru_cache(maxsize=None)
def _stream_orders(n: int, budget: int = 2_000_000) -> "tuple[tuple[int, ...], ...] | None":
    """``n - 1`` orders of ``range(n)`` whose concatenation, read as a cycle, has every ordered
    pair of two different items side by side exactly once; None if the search (backtracking,
    deterministic) takes more than ``budget`` steps (it takes milliseconds up to n = 16)."""
    total, seq, used, steps = n * (n - 1), [], set(), [0]

    def extend(i: int) -> bool:
        steps[0] += 1
        if steps[0] > budget:
            raise TimeoutError
        if i == total:  # closing the cycle: the last item before the first
            return seq[-1] != seq[0] and (seq[-1], seq[0]) not in used
        start = i - i % n
        for x in range(n) if i else (0,):
            if x in seq[start:i]:
                continue
            pair = (seq[-1], x) if i else None
            if pair is not None and (pair[0] == x or pair in used):
                continue
            if pair is not None:
                used.add(pair)
            seq.append(x)
            if extend(i + 1):
                return True
            seq.pop()
            if pair is not None:
                used.discard(pair)
        return False

    try:
        found = extend(0)
    except (TimeoutError, RecursionError):
        return None
    return tuple(tuple(seq[t * n:(t + 1) * n]) for t in range(n - 1)) if found else None


def balanced_orders(n: int) -> list[list[int]]:
    """Orders of ``n`` things, one per turn, such that in the stream of turns played one after
    the other (and from the last back to the first) each one comes straight after each other one
    equally often, across the turns' boundaries too: ``n - 1`` orders in which every ordered pair
    is side by side exactly once (found by a short search), or, from 17 things on, a Williams
    design, balanced within each turn only. A timed call pays for what the call before it left
    behind (garbage to collect, a GPU queue to drain, the L2's contents): in a one-token Llama
    decode on the H200 two copies of one compiled model read 4.3% apart over 4000 turns when the
    order only rotated, so that one always followed an eager forward and the other a compiled one
    (benchmarks/results/2026-12-02-h200-4)."""
    if n <= 2:
        return [list(range(n))]
    found = _stream_orders(n) if n <= 16 else None
    if found is not None:
        return [list(o) for o in found]
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    orders = [[(x + r) % n for x in first] for r in range(n)]
    return orders if n % 2 == 0 else orders + [o[::-1] for o in orders]


def whole_cycles(turns: int, cycle: int, most: int) -> int:
    """``turns`` rounded to whole cycles of ``cycle`` orders (so every one follows every other
    equally often): up, unless that passes ``most``, then down; one cycle at the least."""
    up = -(-turns // cycle) * cycle
    return up if up <= most else max(cycle, most // cycle * cycle)


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
    orders = balanced_orders(n)
    reps = whole_cycles(int(min(max_reps, max(min_reps, rep_ms * n / turn_ms))), len(orders), max_reps)
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
              for _ in range(reps)]
    for r in range(reps):
        for j in orders[r % len(orders)]:
            s, e = events[r][j]
            s.record()
            graphs[j][0].replay()
            e.record()
    torch.cuda.synchronize(device)
    return [[events[r][j][0].elapsed_time(events[r][j][1]) / graphs[j][1] for r in range(reps)]
            for j in range(n)]
