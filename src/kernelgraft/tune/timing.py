"""Timing one candidate on the GPU: CUDA events, warm-up, repeats, median.

Warm (the default), kernels are timed by replaying a CUDA graph of launches (as many as fill about
1 ms), so the host launch cost (~10 us for Triton) neither hides a kernel of a few microseconds nor
is added to some candidates and not others. Timed eagerly (mutating ops, or ``graph=False``), each
launch has GPU work queued ahead of it for twice its host cost, for the same reason.

With ``cold_l2`` every launch is timed alone after an L2 flush (writing a buffer larger than the
cache), as ``kernelgraft bench`` and ``triton.testing.do_bench`` time them; the flush is also the
GPU work queued ahead of the launch. Graph replay over rotated copies of the inputs was the cold
mode before: it ranked two softmax kernels within 1% of each other that per-launch flushed timing
put 7% apart (benchmarks/results/2026-11-30-h200-5/diag_softmax_choice.txt), so the tuner and the
bench disagreed on which was fastest. Mutating ops get their inputs restored before every launch,
outside the timed region; the flush comes after the restore, which would otherwise leave the
mutated inputs in the L2 (it made the tuner choose an FP8 scatter config 4% slower than the best in
benchmarks/results/2026-11-30-h200-4/).

Everything runs on the trial's device (``Trial.device``, the tensors' device), whatever device the
caller has current: events, the capture stream and graph, the L2 flush, the busy cover and the
synchronisations all use torch's current device, so ``cuda_timer`` makes the trial's device current
for its duration (``kernelgraft.timing.on_device``).

A trial with ``must_capture`` (a PyTorch candidate: ``torch:eager``/``torch:compile``) must be
capturable in a CUDA graph: the timer raises ``CaptureRefused`` when it is not, and the tuner
excludes it (kind ``capture``). A user who captures the op's calls (``torch.cuda.graph``, or
``torch.compile(mode="reduce-overhead")``) would otherwise get a reference that syncs with the host
(``.item()``, the fp8 scatter's bounds check) chosen where a capturable kernel was offered. Kernels
that cannot be captured keep the eager timing (some launches legitimately cannot be captured, and
their op is then never captured by its user either); a PyTorch candidate can never outrank a
capturable kernel this way. The capture is tried even where timing does not replay a graph
(mutating ops, cold L2): once, its inputs restored after the warm-up it needs.

A timer is any callable ``timer(trial, settings) -> milliseconds``; tests inject a fake one (which
raises ``CaptureRefused`` to stand for a failed capture).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from ..timing import on_device
from ..timing.capture import capture_calls, replay_graph
from ..timing.gpu_busy import cover
from ..timing.l2 import flush
from ..timing.turns import replay_in_turn

__all__ = ["Trial", "Timer", "CaptureRefused", "cuda_timer", "default_timer", "together"]

log = logging.getLogger(__name__)

_REPLAY_TARGET_MS = 1.0  # launches per graph chosen so one replay takes about this long


@dataclasses.dataclass
class Trial:
    """What the timer measures: ``run(i)`` launches the candidate on argument set ``i`` (of
    ``n_sets``); ``restore(i)``, when set, puts set ``i``'s inputs back before a launch."""

    candidate: Any
    run: Callable[[int], None]
    n_sets: int = 1
    restore: Callable[[int], None] | None = None
    budget_s: float = math.inf  # time this trial may take
    cold: bool = False  # cold-L2 timing asked for: evict the L2 before each timed launch
    device: torch.device | None = None  # the tensors' device (None: the current one)
    must_capture: bool = False  # a CUDA-graph capture of run() must succeed (else CaptureRefused)


class CaptureRefused(Exception):
    """A ``must_capture`` trial could not be captured in a CUDA graph; the message says why."""


Timer = Callable[[Trial, Any], float]


def _elapsed(pairs) -> list[float]:
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in pairs]


def _events(n: int):
    return [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]


def _eager(trial: Trial, reps: int, host_us: float | None = None) -> tuple[list[float], float]:
    """Per-launch times (ms) and the host's cost per launch (us). Given ``host_us`` (a launch's
    host cost), GPU work is queued before each start event so the launch is enqueued before the
    GPU reaches it (see kernelgraft.timing.gpu_busy); without it a short kernel is timed by its host
    launch cost."""
    pairs = _events(reps)
    host = []
    for i, (start, end) in enumerate(pairs):
        k = i % trial.n_sets
        if trial.restore is not None:
            trial.restore(k)
        if trial.cold:  # after the restore, which leaves the mutated inputs in the L2
            flush(trial.device or torch.device("cuda"))  # tens of microseconds of GPU work: covers the launch too
        elif host_us is not None:
            cover(host_us, slack_us=20.0)
        start.record()
        t = time.perf_counter()
        trial.run(k)
        host.append(time.perf_counter() - t)
        end.record()
    return _elapsed(pairs), statistics.median(host) * 1e6


def _captured(trial: Trial, graph: "torch.cuda.CUDAGraph", inner: int) -> str | None:
    """Capture ``inner`` launches of ``trial`` into ``graph``; None, or why the capture failed."""
    return capture_calls(graph, lambda j: trial.run(j % trial.n_sets), inner)


def _probe(trial: Trial) -> str | None:
    """Whether ``trial`` can be captured, for a timing that replays no graph (mutating ops, cold
    L2): one launch captured and thrown away; the warm-up's mutation undone."""
    if trial.restore is not None:
        trial.restore(0)
    graph = torch.cuda.CUDAGraph()
    failed = _captured(trial, graph, 1)
    del graph
    if trial.restore is not None:
        trial.restore(0)
    return failed


def _graphed(trial: Trial, reps: int, est_ms: float) -> tuple[list[float] | None, str | None]:
    """Per-launch times from graph replay, or (None, why the capture failed)."""
    made = replay_graph(lambda j: trial.run(j % trial.n_sets), est_ms, _REPLAY_TARGET_MS)
    if isinstance(made, str):
        log.debug("graph capture of %s failed (%s); timing eagerly", trial.candidate, made)
        return None, made
    graph, inner = made
    pairs = _events(reps)
    for start, end in pairs:
        start.record()
        graph.replay()
        end.record()
    times = [t / inner for t in _elapsed(pairs)]
    del graph
    return times, None


def cuda_timer(trial: Trial, settings: Any) -> float:
    """Median milliseconds of one launch of ``trial`` on its device (``trial.device``, else the
    current CUDA device)."""
    with on_device(trial.device):
        return _cuda_timer(trial, settings)


def _cuda_timer(trial: Trial, settings: Any) -> float:
    warmup = max(1, int(getattr(settings, "warmup", 3)))
    max_reps = max(3, int(getattr(settings, "repeats", 50)))
    use_graph = bool(getattr(settings, "graph", True))
    started = time.perf_counter()
    torch.cuda.synchronize()
    warm, host_us = _eager(trial, warmup)
    est = statistics.median(warm)
    # as many repeats as fit in this trial's share of the budget (at least 3)
    spent = time.perf_counter() - started
    room_ms = max(0.0, (trial.budget_s - spent) * 1e3) if math.isfinite(trial.budget_s) else math.inf
    reps = max(3, min(max_reps, int(room_ms / max(est, 1e-3) / 2)) if math.isfinite(room_ms) else max_reps)
    # Every candidate of a key is timed the same way: mixing graph replay (no launch gaps) for
    # some with eager events (launch latency included) for others misranks kernels near the
    # cut-off (seen on the H200: a 25 us GEMM timed eagerly lost to a 49 us one timed by replay).
    failed = None
    if use_graph and trial.restore is None and not trial.cold:
        times, failed = _graphed(trial, reps, est)
        if times is not None:
            return statistics.median(times)
    elif trial.must_capture:
        failed = _probe(trial)
    if failed is not None and trial.must_capture:
        raise CaptureRefused(failed)
    return statistics.median(_eager(trial, reps, host_us)[0])


def host_ms(trial: Trial, calls: int = 10) -> float:
    """Median milliseconds the host spends in one ``trial.run`` with the GPU kept busy, so only
    the enqueueing is timed: Python, dispatch, Dynamo's guards, launches."""
    with on_device(trial.device):
        torch.cuda.synchronize()
        _, first_us = _eager(trial, 2)
        _, host_us = _eager(trial, calls, host_us=first_us)
        torch.cuda.synchronize()
    if trial.restore is not None:
        for k in range(trial.n_sets):
            trial.restore(k)
    return host_us / 1e3


def together(trials: "list[Trial]", settings: Any, estimates_ms: "list[float]") -> "list[float | None]":
    """Median milliseconds of one launch of each of ``trials`` (one key's candidates, on one
    device), their CUDA graphs replayed in turn (``kernelgraft.timing.turns``): the finalists'
    timing, every one at the same clock. ``estimates_ms``: each one's first-pass time, to size its
    graph. All None, with nothing timed, when fewer than two are given or any one cannot be timed
    so (it restores its inputs, times a cold L2, or its capture fails): the caller then re-times
    them its other way."""
    out: "list[float | None]" = [None] * len(trials)
    if len(trials) < 2 or not bool(getattr(settings, "graph", True)):
        return out
    if any(trial.restore is not None or trial.cold for trial in trials):
        return out
    with on_device(trials[0].device):
        graphs = []  # (graph, calls per replay), one per trial, in order
        for trial, est in zip(trials, estimates_ms):
            made = replay_graph(lambda j, t=trial: t.run(j % t.n_sets), est, _REPLAY_TARGET_MS)
            if isinstance(made, str):
                log.debug("graph capture of %s failed (%s); finalists not timed in turn", trial.candidate, made)
                return out
            graphs.append(made)
        turns = max(3, int(getattr(settings, "repeats", 50)))
        samples = replay_in_turn(graphs, None, warmup_ms=2.0, rep_ms=_TOGETHER_MS, min_reps=5, max_reps=turns)
        del graphs
    return [statistics.median(got) for got in samples]


_TOGETHER_MS = 20.0  # GPU time of each finalist's replays in ``together`` (about 20 turns)

# A timer may also time several trials at once, in turn (``timer.together``): the tuner re-times
# its finalists that way where it can (kernelgraft.tune.trials).
cuda_timer.together = together  # type: ignore[attr-defined]

# A timer may also say what one call costs the host (``timer.host_ms(trial)``): the tuner scores
# torch:compile by the larger of the two and records it beside the others' GPU time (see
# kernelgraft.tune.trials).
cuda_timer.host_ms = host_ms  # type: ignore[attr-defined]


def default_timer() -> Timer:
    return cuda_timer
