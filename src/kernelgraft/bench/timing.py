"""GPU timing: median of per-call CUDA-event times with a cold L2 before every call.

Before every timed call the stream is kept busy for twice the call's host cost, so a call whose
launch takes the host longer than its kernel takes the GPU is still timed by its kernel alone.

With ``graph=True`` the calls are instead captured into a CUDA graph (as many as fill about a
millisecond) and the graph is replayed: GPU time back to back, with no host launch cost and a warm
L2 for inputs that fit in it, the way a model step replayed as a CUDA graph runs them. A callable
that cannot be captured is timed by per-call events instead (``Timing.method`` says which).
``measure_interleaved`` times several callables that way at once, their replays taken in turn, so
a clock that drifts over milliseconds (a large GEMM's power draw) lands on all of them alike.

Like ``triton.testing.do_bench`` (which this mirrors rather than calls, because its signature
differs across Triton releases): a warm-up, a repetition count fitted to a time budget, and an L2
flush (writing a buffer larger than the cache) between calls, so every call reads its inputs from
HBM as in a real model step.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections.abc import Callable

import torch

from ..timing import on_device
from ..timing.capture import replay_graph
from ..timing.gpu_busy import cover
from ..timing.l2 import FLUSH_BYTES, flush_buffer as _flush
from ..timing.turns import replay_in_turn

__all__ = ["Timing", "measure", "measure_interleaved", "FLUSH_BYTES"]

log = logging.getLogger(__name__)

_REPLAY_TARGET_MS = 1.0  # calls per captured graph chosen so one replay takes about this long
_MAX_CALLS_PER_GRAPH = 200


@dataclasses.dataclass(frozen=True)
class Timing:
    median_us: float
    min_us: float
    p20_us: float
    p80_us: float
    reps: int
    method: str = "events"  # "events": per-call CUDA events; "graph": CUDA-graph replay
    calls: int = 1  # calls per replayed graph ("graph"), 1 for per-call events


def summarize(samples_us: list[float], method: str = "events", calls: int = 1) -> Timing:
    """Median and spread of per-call times (microseconds)."""
    if not samples_us:
        raise ValueError("no timing samples")
    ordered = sorted(samples_us)
    q = lambda f: ordered[min(len(ordered) - 1, int(f * len(ordered)))]  # noqa: E731
    return Timing(statistics.median(ordered), ordered[0], q(0.2), q(0.8), len(ordered), method, calls)


def measure(
    fn: Callable[[], object],
    *,
    device: torch.device | str = "cuda",
    warmup_ms: float = 100.0,
    rep_ms: float = 60.0,
    min_reps: int = 5,
    max_reps: int = 500,
    cold_l2: bool = True,
    graph: bool = False,
) -> Timing:
    """Median time of ``fn()`` in microseconds over about ``rep_ms`` of GPU time, measured on
    ``device`` (the device of the tensors ``fn`` works on; "cuda" is the current one); by CUDA-graph
    replay with ``graph=True`` (``cold_l2`` then does not apply: a callable that cannot be captured
    is timed by per-call events with a warm L2, as ``measure_interleaved`` times it)."""
    device = torch.device(device)
    if device.type != "cuda":
        raise RuntimeError("kernelgraft.bench.measure needs a CUDA device")
    # events, the flush buffer and the busy cover follow torch's current device: make it ``device``
    with on_device(device):
        if graph:
            timing = _measure_graph(fn, device, warmup_ms, rep_ms, min_reps, max_reps)
            if timing is not None:
                return timing
        return _measure(fn, device, warmup_ms, rep_ms, min_reps, max_reps, cold_l2 and not graph)


def measure_interleaved(
    fns: "list[Callable[[], object]]",
    *,
    device: torch.device | str = "cuda",
    warmup_ms: float = 100.0,
    rep_ms: float = 60.0,
    min_reps: int = 5,
    max_reps: int = 500,
) -> "list[Timing | Exception]":
    """Per-call GPU time of each of ``fns`` (microseconds), by CUDA-graph replays taken in turn:
    one replay of each graph (about a millisecond of work), then the next round of replays, in
    orders where each graph follows each other one equally often
    (``kernelgraft.timing.turns.balanced_orders``), for about ``rep_ms`` of each; a
    :class:`Timing` per callable (the median of its replays), or the exception that timing it
    raised.

    Timed one after the other, each over tens of milliseconds, two runs of the very same cuBLAS
    GEMM read 259 and 327 us within one round on the H200: its clock under a GEMM's power draw
    moves over milliseconds to seconds. Replays taken in turn, back to back on the GPU, see the
    same clock to within a millisecond, so the ratio of two medians is the ratio of the work. A
    callable that cannot be captured is timed alone afterwards by per-call events (warm L2)."""
    device = torch.device(device)
    if device.type != "cuda":
        raise RuntimeError("kernelgraft.bench.measure_interleaved needs a CUDA device")
    results: "list[Timing | Exception | None]" = [None] * len(fns)
    graphs: list[tuple[int, object, int]] = []  # (index into fns, graph, calls per replay)
    with on_device(device):
        for i, fn in enumerate(fns):
            try:
                made = _graph_of(fn, device)
            except Exception as exc:  # the callable itself fails: its row says so
                results[i] = exc
                continue
            if made is not None:
                graphs.append((i, *made))
        made = None  # the graphs (and their memory pools) live in ``graphs`` only
        if graphs:
            samples = replay_in_turn([(g, inner) for _, g, inner in graphs], device, warmup_ms, rep_ms,
                                     min_reps, max_reps)
            for (i, _, inner), got in zip(graphs, samples):
                results[i] = summarize([ms * 1e3 for ms in got], "graph", inner)
            del graphs
        for i, fn in enumerate(fns):  # not capturable: alone, by per-call events
            if results[i] is None:
                try:
                    results[i] = _measure(fn, device, warmup_ms, rep_ms, min_reps, max_reps, cold_l2=False)
                except Exception as exc:
                    results[i] = exc
    return results  # type: ignore[return-value]


def _graph_of(fn, device) -> "tuple[object, int] | None":
    """A CUDA graph of several calls of ``fn`` (about a millisecond of GPU time) and the number of
    calls in it; None if ``fn`` cannot be captured (a host synchronisation, a CPU tensor)."""
    fn()  # compile / allocate outside the capture
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    torch.cuda.synchronize(device)
    # an eager estimate includes launch gaps: replay_graph corrects the calls per graph
    made = replay_graph(lambda _: fn(), max(start.elapsed_time(end) / 3, 1e-3), _REPLAY_TARGET_MS,
                        _MAX_CALLS_PER_GRAPH)  # ``device`` is current
    if isinstance(made, str):
        log.warning("CUDA-graph capture failed (%s); timing by per-call events", made)
        return None
    return made


def _measure_graph(fn, device, warmup_ms, rep_ms, min_reps, max_reps) -> Timing | None:
    """Per-call times from replays of a CUDA graph of several calls; None if ``fn`` cannot be
    captured (a host synchronisation, a CPU tensor), so the caller times it eagerly."""
    made = _graph_of(fn, device)
    if made is None:
        return None
    samples = replay_in_turn([made], device, warmup_ms, rep_ms, min_reps, max_reps)[0]
    return summarize([ms * 1e3 for ms in samples], "graph", made[1])


def _measure(fn, device, warmup_ms, rep_ms, min_reps, max_reps, cold_l2) -> Timing:
    fn()  # compile / allocate outside the timed region
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host = time.perf_counter()
    start.record()
    for _ in range(3):
        fn()
    end.record()
    host_us = (time.perf_counter() - host) / 3 * 1e6
    torch.cuda.synchronize(device)
    estimate_ms = max(start.elapsed_time(end) / 3, 1e-3)
    flush = _flush(device) if cold_l2 else None
    # Warm up for wall time, not a call count, with the same flush + call pattern as the timed
    # loop: after an idle spell (a torch.compile of the reference, say) the GPU's clocks take tens
    # of milliseconds to come back up, and per-call times of a few microseconds measured before
    # that were seen at 2-4x their steady value on the H200.
    deadline = time.perf_counter() + warmup_ms / 1e3
    while time.perf_counter() < deadline:
        if flush is not None:
            flush.zero_()
        fn()
        torch.cuda.synchronize(device)
    reps = int(min(max_reps, max(min_reps, rep_ms / estimate_ms)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if flush is not None:
            flush.zero_()
        # GPU work queued ahead of the call, so its host enqueue is not timed (kernelgraft.timing.gpu_busy);
        # the slack covers the flush's and the events' own launches
        cover(host_us, slack_us=30.0)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize(device)
    return summarize([s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)])
