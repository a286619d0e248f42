"""Benchmark one op: every candidate, the best of each backend, torch eager and torch.compile of
the reference, peers (other implementations of the op), the op as dispatched, and the tuned op,
on each of its benchmark shapes."""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from ..op.compete import is_torch
from ..timing import on_device
from .ceilings import Ceilings
from .cost import call_cost, describe_inputs
from .peers import Peer, as_peers
from .suite import regime_of
from .timing import Timing, measure, measure_interleaved
from .. import tune
from ..op.plan import kernel_plan
from ..tune.decision import entry_label

__all__ = ["Row", "bench_op", "tuned_label"]

log = logging.getLogger(__name__)

Timer = Callable[[Callable[[], object]], Timing]
# times several callables at once (measure_interleaved): a Timing, or the exception, for each
Together = Callable[[list], list]

# kinds of rows, in display order
CANDIDATE, BACKEND, EAGER, COMPILE, PEER, DEFAULT, TUNED = (
    "candidate", "backend", "eager", "compile", "peer", "default", "tuned")
TIMINGS = ("cold", "graph")  # per-call events after an L2 flush; CUDA-graph replay


@dataclasses.dataclass
class Row:
    op: str
    shape: str
    size: int  # index of the shape in the op's bench_inputs (small to large)
    bytes: float
    flops: float
    kind: str
    variant: str
    backend: str = ""
    time_us: float | None = None
    gbps: float | None = None
    tflops: float | None = None
    bw_frac: float | None = None
    flops_frac: float | None = None
    reps: int = 0
    detail: str = ""
    error: str | None = None
    vs_best: float | None = None  # tuned rows: time / fastest candidate's, timed head to head
    vs_compile: float | None = None  # tuned rows: time / torch.compile's, timed head to head
    vs_tuned: float | None = None  # eager, compile and peer rows: the tuned op's time / this row's
    # tuned rows: time / the chosen kernel's, forced and timed the same way (about 1: the op adds
    # no GPU work of its own to its kernel; much more: the measurement or the op's path is wrong)
    vs_chosen: float | None = None
    regime: str = ""  # the shape's regime in its suite (kernelgraft.bench.suite), '' if untagged
    method: str = ""  # how it was timed: "events" (per call) or "graph" (CUDA-graph replay)
    calls: int = 0  # calls per replayed graph ("graph": a handful would add the graph launch to each)
    rounds: int = 1  # timings behind time_us: with several, it is their median (bench_op's rounds)
    spread: float | None = None  # slowest / fastest of those timings (drift and noise, not the op)
    samples: list | None = None  # those timings (us) round by round, None where one failed: ratios pair by round
    # tuned rows: the tuner's decision as [label, score ms, GPU ms, host ms] (the first three and
    # every PyTorch candidate), so a report shows why the winner won
    ranking: list | None = None

    def fill(self, timing: Timing | None, ceilings: Ceilings | None) -> "Row":
        if timing is None:
            return self
        self.time_us, self.reps = timing.median_us, timing.reps
        self.method = getattr(timing, "method", "")
        self.calls = getattr(timing, "calls", 0)
        seconds = timing.median_us * 1e-6
        if seconds > 0:
            self.gbps = self.bytes / seconds / 1e9
            self.tflops = self.flops / seconds / 1e12
            if ceilings is not None:
                self.bw_frac = self.gbps / ceilings.copy_gbps if ceilings.copy_gbps else None
                self.flops_frac = self.tflops / ceilings.bf16_tflops if ceilings.bf16_tflops else None
        return self


def tuned_label() -> str:
    """The label of the row that times the op as the autotuner serves it."""
    return "tuned (kg.tune)"


def _device_of(args: tuple) -> torch.device | None:
    """The device of the first tensor among ``args`` (or in a list of tensors), None if none."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            return a[0].device
    return None


def _candidate_fn(op: Any, candidate: Any, args: tuple) -> Callable[[], object]:
    """The candidate's plan built once, so timing sees launch cost, not planning."""
    plan = kernel_plan(op, candidate, op.dispatcher.runner(candidate), op.dispatcher.output_specs(args))
    return lambda: plan(args)


def _mode(name: str, **options: Any):
    """``kg.tune(name, **options)``: the tuning mode a row is timed under."""
    return tune.tune(name, **options)


def _timed(row: Row, fn: Callable[[], object] | None, timer: Timer, ceilings: Ceilings | None) -> Row:
    if fn is None:
        return row
    try:
        row.fill(timer(fn), ceilings)
    except Exception as exc:  # one failing variant must not end the run
        row.error = _error(exc)
        log.warning("%s %s %s failed: %s", row.op, row.shape, row.variant, row.error)
    return row


HEAD_TO_HEAD_PAIRS = 3


def head_to_head(fn: Callable[[], object], other: Callable[[], object], timer: Timer,
                 pairs: int = HEAD_TO_HEAD_PAIRS) -> float:
    """time(fn) / time(other): the median over ``pairs`` of the geometric mean of two rounds, one
    timing ``fn`` first and one ``other`` first.

    Separate timings of two kernels of a few microseconds differ by a few percent from clock and
    queue drift alone, and the fastest of many candidates is biased low by that noise. Alternating
    the order within a pair cancels a steady drift; the median drops an outlying pair."""
    values = []
    for _ in range(pairs):
        a1, b1 = timer(fn).median_us, timer(other).median_us
        b2, a2 = timer(other).median_us, timer(fn).median_us
        if b1 > 0 and b2 > 0:
            values.append(math.sqrt((a1 / b1) * (a2 / b2)))
    return sorted(values)[len(values) // 2] if values else math.nan


def _compiled(reference: Callable[..., Any], dynamic: bool = False) -> Callable[..., Any]:
    import torch._dynamo

    # One specialisation per shape: raise the recompile limit so large sweeps keep compiling.
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 256))
    return torch.compile(reference, dynamic=dynamic)


def _timers(timing: str, timer: Timer | None) -> tuple[Timer, Timer]:
    """(full timer, quick timer for head-to-head rounds) of a timing method, or the given timer."""
    if timer is not None:
        return timer, timer
    if timing not in TIMINGS:
        raise ValueError(f"bench timing {timing!r}: expected one of {', '.join(TIMINGS)}")
    graph = timing == "graph"
    # head-to-head rounds follow a full timing of both sides: a short warm-up suffices
    return (lambda fn: measure(fn, graph=graph)), (lambda fn: measure(fn, warmup_ms=20.0, rep_ms=30.0, graph=graph))


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def _peer_row(base: dict, peer: Peer, op: Any, args: tuple, expected: Any, timer: Timer,
              ceilings: Ceilings | None) -> tuple[Row, Callable[[], object] | None]:
    """Time one peer after checking that it computes what the op computes (a mismatch is noted,
    not hidden: a peer that skips work would otherwise look fast); the row and what was timed."""
    from ..verify.oracle import compare_trees

    row = Row(**base, kind=PEER, variant=f"peer: {peer.name}", backend="peer")
    try:
        got = peer.fn(*args)
    except Exception as exc:
        row.error = _error(exc)
        log.warning("%s %s: peer %s failed: %s", row.op, row.shape, peer.name, row.error)
        return row, None
    try:
        problem = compare_trees(expected, got, tolerances=op.tolerances, what=f"peer {peer.name}")
    except Exception as exc:  # an output the comparison cannot read is a mismatch too
        problem = _error(exc)
    if problem:
        row.detail = f"differs from the op: {problem}"[:300]
    fn = lambda: peer.fn(*args)  # noqa: E731
    return _timed(row, fn, timer, ceilings), fn


def bench_op(
    op: Any,
    inputs: Iterable[tuple],
    *,
    ceilings: Ceilings | None,
    timer: Timer | None = None,
    compile: bool = True,
    tune: bool = True,
    on_row: Callable[[Row], None] | None = None,
    peers: Any = None,
    timing: str = "cold",
    candidates: bool = True,
    untuned: bool = True,
    dynamic: bool = False,
    compare: bool = True,
    rounds: int = 1,
    together: Together | None = None,
) -> list[Row]:
    """All rows for ``op`` over ``inputs`` (tuples of arguments, small to large; a
    :class:`~kernelgraft.bench.Case` carries its regime into the rows).

    ``peers`` (callables with the op's signature, see ``kernelgraft.bench.peers``) are timed
    beside it; ``timing`` is "cold" (per-call events after an L2 flush, the tuner tuning in that
    regime) or "graph" (CUDA-graph replay, the tuner's default regime). ``candidates=False``
    skips timing every candidate (the tuned op is still timed), ``untuned=False`` the op with the
    tuner off, ``dynamic=True`` compiles the reference once with dynamic shapes instead of once
    per shape, and ``compare=False`` skips the head-to-head rounds behind ``vs_best`` and
    ``vs_compile`` (a dozen more timings per shape). With ``rounds=N`` the tuned op, eager,
    torch.compile and the peers of a shape are timed N times in rotating order, each keeping the
    median (``Row.rounds``, ``Row.spread``): timed once, one after the other, the same cuBLAS GEMM
    read 262 and 306 us a few seconds apart on the H200 (clock drift under a GEMM's power draw).
    With ``timing="graph"`` and ``rounds`` of 2 or more each round times them all at once, their
    graph replays taken in turn: by ``together`` where given, else by ``measure_interleaved`` where
    ``timer`` is not given either (a timer of one's own keeps its rounds one row after another).
    ``together`` is ignored for "cold"."""
    if together is None and timing == "graph" and timer is None:
        together = measure_interleaved
    elif timing != "graph":
        together = None
    timer, quick = _timers(timing, timer)
    peer_list = as_peers(peers)
    rows: list[Row] = []
    compiled = None

    def emit(row: Row) -> Row:
        rows.append(row)
        if on_row is not None:
            on_row(row)
        return row

    for size, args in enumerate(inputs):
        regime = regime_of(args)
        args = tuple(args)
        # every timing of this shape on the device of its tensors, whatever device is current
        with on_device(_device_of(args)):
            shape = describe_inputs(args)
            try:
                with _mode("off"):
                    outputs = op(*args)
                nbytes, flops = call_cost(op, args, outputs)
            except Exception as exc:
                emit(Row(op.name, shape, size, math.nan, math.nan, DEFAULT, "kg op",
                         error=_error(exc)))
                continue
            base = dict(op=op.name, shape=shape, size=size, bytes=nbytes, flops=flops, regime=regime)
            cand_rows, cand_fns = [], {}
            for cand in (op.candidates(*args) if candidates else ()):
                if not cand.supported or is_torch(cand):  # PyTorch has its own rows below
                    continue
                row = Row(**base, kind=CANDIDATE, variant=cand.label, backend=cand.impl.backend)
                try:
                    fn = _candidate_fn(op, cand, args)
                except Exception as exc:
                    row.error, fn = _error(exc), None
                cand_rows.append(emit(_timed(row, fn, timer, ceilings)))
                cand_fns[id(cand_rows[-1])] = fn
            timed = [r for r in cand_rows if r.time_us is not None]
            for backend in sorted({r.backend for r in timed}):
                best = min((r for r in timed if r.backend == backend), key=lambda r: r.time_us)
                emit(dataclasses.replace(best, kind=BACKEND, variant=f"best {backend}", detail=best.variant))
            eager_fn = lambda: op.reference(*args)  # noqa: E731
            rivals = [emit(_timed(Row(**base, kind=EAGER, variant="torch eager", backend="torch"),
                                  eager_fn, timer, ceilings))]
            rival_fns = [eager_fn]
            compile_fn = None
            if compile:
                row = Row(**base, kind=COMPILE, variant="torch.compile" + (" (dynamic)" if dynamic else ""),
                          backend="torch")
                try:
                    compiled = compiled or _compiled(op.reference, dynamic)
                    fn = lambda: compiled(*args)  # noqa: E731
                except Exception as exc:
                    row.error, fn = _error(exc), None
                rivals.append(emit(_timed(row, fn, timer, ceilings)))
                rival_fns.append(fn)
                compile_fn = fn if row.time_us is not None else None
            for peer in peer_list:
                row, fn = _peer_row(base, peer, op, args, outputs, timer, ceilings)
                rivals.append(emit(row))
                rival_fns.append(fn)
            if untuned:
                with _mode("off"):
                    emit(_timed(Row(**base, kind=DEFAULT, variant="kg op (untuned default)", backend="kg"),
                                lambda: op(*args), timer, ceilings))
            label = tuned_label() if tune else "tuned (best measured)"
            tuned = Row(**base, kind=TUNED, variant=label, backend="kg")
            if tune and label == "tuned (kg.tune)":
                # The first call inside the block tunes (or reads the cache); the timer's own first
                # call is untimed, so the timed calls all run the chosen plan.
                try:
                    # tune in the regime this report measures (cold L2, or the tuner's own
                    # graph replay), so "tuned" and "best candidate" are judged by the same clock
                    with _mode("on", cold_l2=timing == "cold", blocking=True):  # tuned before timed
                        _timed(tuned, lambda: op(*args), timer, ceilings)
                        plan = op.dispatcher.plan_for(args)
                        chosen = getattr(plan, "candidate", None)
                        tuned.detail = getattr(chosen, "label", "") or ""
                        tuned.ranking = _ranking(op, args)
                        if chosen is not None and is_torch(chosen):  # the reference was fastest
                            tuned.detail += " (PyTorch won the tuning)"
                        elif chosen is not None and tuned.time_us:
                            _check_chosen(tuned, op, chosen, args, timer)
                        # inside the tuning block: the tuned op's plans belong to its scope; in
                        # the order of the first round (rivals, then the op), which the rounds rotate
                        in_rounds(list(zip([*rivals, tuned], [*rival_fns, lambda: op(*args)])),
                                  timer, ceilings, rounds, together)
                        if compare and tuned.time_us is not None:
                            _compare(tuned, lambda: op(*args), timed, cand_fns, compile_fn, quick)
                    emit(tuned)
                except Exception as exc:
                    tuned.error = _error(exc)
                    if tuned not in rows:
                        emit(tuned)
            else:
                in_rounds(list(zip(rivals, rival_fns)), timer, ceilings, rounds, together)
                if timed:
                    best = min(timed, key=lambda r: r.time_us)
                    tuned = emit(dataclasses.replace(best, kind=TUNED, variant=label, backend="kg",
                                                     detail=best.variant))
            for rival in rivals:
                if tuned.time_us and rival.time_us:
                    rival.vs_tuned = tuned.time_us / rival.time_us
            del args, outputs
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return rows


def _ranking(op: Any, args: tuple, top: int = 3) -> list | None:
    """The tuner's decision for ``args`` as ``[label, score, GPU, host]`` rows (ms), or None."""
    try:
        decision = tune.decision(op, *args)
    except Exception:  # no tuner, or inputs it cannot key: the report goes without
        return None
    if decision is None:
        return None
    return [[entry_label(e), e.get("ms"), e.get("gpu_ms"), e.get("host_ms")]
            for n, e in enumerate(decision.ranking) if n < top or e.get("backend") == "torch"]


def in_rounds(timed: Sequence[tuple[Row, Callable[[], object] | None]], timer: Timer,
              ceilings: Ceilings | None, rounds: int, together: Together | None = None) -> None:
    """Time each row's callable in ``rounds`` rounds, each keeping the median of its rounds, their
    spread and ``samples`` round by round (None for a round that failed, so rounds stay aligned
    across rows). Rows that were not timed stay as they are.

    With ``together`` (``measure_interleaved``: one timing of all the callables at once, their
    replays taken in turn, in balanced orders) each round is one such timing.
    Without it the first timing (``timed`` in the order round one took) is round one and each
    later round times the rows one after the other, the order rotating by one per round, so that
    drift over the rounds lands on every row alike."""
    live = [(row, fn) for row, fn in timed if fn is not None and row.time_us is not None]
    if rounds <= 1 or not live:
        return
    samples: dict[int, list[float | None]] = {id(row): [] if together else [row.time_us] for row, _ in live}
    # how each row's timings were taken (method, calls per graph, reps): the last that counted
    how: dict[int, tuple] = {id(row): (row.method, row.calls, row.reps) for row, _ in live}
    for r in range(0 if together else 1, rounds):
        turn = live[r % len(live):] + live[:r % len(live)]
        if together is not None:
            try:
                got = list(together([fn for _, fn in turn]))
                if len(got) != len(turn):
                    raise RuntimeError(f"{len(got)} timings for {len(turn)} callables")
            except Exception as exc:  # the whole round failed: every row's round is missing
                got = [exc] * len(turn)
        else:
            got = []
            for _, fn in turn:
                try:
                    got.append(timer(fn))
                except Exception as exc:  # a round that fails leaves the others to judge by
                    got.append(exc)
        for (row, _), timing in zip(turn, got):
            if isinstance(timing, BaseException):
                samples[id(row)].append(None)
                log.warning("%s %s %s: round %d failed: %s", row.op, row.shape, row.variant, r, _error(timing))
            else:
                samples[id(row)].append(timing.median_us)
                how[id(row)] = (timing.method, timing.calls, timing.reps)
    for row, _ in live:
        got = [t for t in samples[id(row)] if t is not None]
        if not got:  # every round failed: the row keeps its first timing
            continue
        median = statistics.median(got)
        method, calls, reps = how[id(row)]
        row.fill(Timing(median, min(got), median, median, reps, method, calls), ceilings)
        row.rounds, row.spread, row.samples = len(got), max(got) / min(got), samples[id(row)]


def _check_chosen(tuned: Row, op: Any, chosen: Any, args: tuple, timer: Timer) -> None:
    """``tuned.vs_chosen``: the tuned op against its own chosen kernel forced, by the same timer."""
    try:
        forced = timer(_candidate_fn(op, chosen, args))
    except Exception as exc:  # a kernel that cannot be forced alone leaves the tuned time as it is
        log.warning("%s %s: timing the chosen kernel alone failed: %s", tuned.op, tuned.shape, exc)
        return
    if forced is not None and forced.median_us > 0:
        tuned.vs_chosen = tuned.time_us / forced.median_us


def _compare(tuned: Row, fn, timed: list[Row], cand_fns: dict, compile_fn, timer: Timer) -> None:
    """Fill ``tuned.vs_best`` and ``tuned.vs_compile`` from head-to-head timings."""
    try:
        if timed:
            best = min(timed, key=lambda r: r.time_us)
            tuned.vs_best = head_to_head(fn, cand_fns[id(best)], timer)
        if compile_fn is not None:
            tuned.vs_compile = head_to_head(fn, compile_fn, timer)
    except Exception as exc:  # a failed comparison leaves the plain timings to judge by
        log.warning("%s %s: head-to-head timing failed: %s", tuned.op, tuned.shape, exc)


def summary_rows(rows: Sequence[Row], *, all_candidates: bool = False) -> list[Row]:
    """Rows for the terminal table: per-backend bests instead of every candidate unless asked."""
    return [r for r in rows if all_candidates or r.kind != CANDIDATE]
