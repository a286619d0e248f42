"""Trials: run every candidate once through the correctness gate, then time the ones that pass.

Phases: (0) compile the candidates in parallel, in worker processes (``compile_pool``; where it
cannot, they compile one by one in phase 1), while this thread gates ``torch:compile`` (Inductor
compiling the reference for the shape takes seconds, which then overlap the workers'); (1) gate
every candidate (the first launch: a compile where phase 0 did not do it; such a gate, and
``torch:compile``'s, is a heavy unit, which a tuning off the caller's path starts only in a pause
of serving or after a bound: ``_pace``); (2) keep the GPU busy for ``WARM_MS``, then time every
candidate back to back; (3) re-time the finalists: those scored by GPU time within
``TOGETHER_MARGIN`` of the fastest (at most ``MAX_TOGETHER``) together, their CUDA graphs replayed
in turn, every one at the same clock; that timing orders them (on the first pass's scale). Where the timer cannot (no
``timer.together``, inputs restored per launch, cold L2, a failed capture), the finalists within
``FINAL_MARGIN`` (at most ``MAX_FINALISTS``, torch:compile's host-scored time included) are timed
``FINAL_ROUNDS`` more times one after the other, each keeping its fastest median.

Why the warm-up, on every key: without it the candidate timed first won large GEMMs it was 10%
slower at (most likely it ran on the power headroom an idle GPU builds up, the others at the
sustained clock; H200, 2026-11-30: with the warm-up the 22-shape sweep's worst choice was 1.033x
the best, at a 3 us kernel; skipping it when no compile had happened gave 1.099x on two large
shapes; both runs are in benchmarks/results/2026-11-30-h200-2/. With the warm-up, a 1% tie margin
and two finalists the sweep chose the best config on all 22 shapes: benchmarks/results/
2026-11-30-h200-3/).

The caller's tensors are never written: the gate runs each kernel on guarded copies
(``_gate.guarded``), and the kernels it passes write only their outputs and mutated arguments;
mutating ops get private copies for timing, restored from a pristine copy before every launch.
Outputs are preallocated (poisoned and guarded for the gate run), so timing sees the kernel, not
the allocator.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..verify import oracle as _verify
from ..errors import out_of_memory
from ..op import compete as _compete
from ..timing import on_device
from .compile_jobs import settle_inductor_triton_cache, start_inductor_workers
from .compile_pool import Ahead, Summary, compile_ahead, moved, would_use
from .gate import classify_error, expected, guarded, judge
from .phases import clock, count, phase
from . import triton_compiles as _triton_compiles
from .timing import CaptureRefused, Trial, cuda_timer

__all__ = ["Result", "run_trials", "settle_for_inductor", "start_for_inductor"]

log = logging.getLogger(__name__)
WARM_MS = 30.0  # GPU busy time before the first timing, every key (see the module docstring)
# Finalists re-timed one after the other (where they cannot be timed together): first-pass times
# within 3% of the fastest (three times the tuner's tie margin), where noise, not the kernels,
# would decide; the two fastest are re-timed once more each. Kept
# small: every extra timing costs tuning wall time, which pruning is meant to cut (by 5x or more).
FINAL_MARGIN = 0.03
MAX_FINALISTS = 2
FINAL_ROUNDS = 1
# Timed together (about 20 ms of replays each), up to four within 5%: a first pass at a drifting
# clock reads the same cuBLAS GEMM 259 or 327 us on the H200 (benchmarks/results/2026-12-02-h200-3),
# so its order among close candidates is the clock's as much as the kernels'.
TOGETHER_MARGIN = 0.05
MAX_TOGETHER = 4


@dataclasses.dataclass
class Result:
    """One candidate's outcome: ``ms`` (its score) when it passed, else ``kind`` and ``reason``.
    ``gpu_ms`` and ``host_ms``: what the score was made of, GPU time and the host's time per call
    (None when the timer does not measure the host); Inductor's in-graph choice reads both."""

    candidate: Any
    ms: float | None = None
    kind: str | None = None  # compile | launch | memory | wrong | budget | crash | timing | capture
    reason: str | None = None
    gpu_ms: float | None = None
    host_ms: float | None = None


def _copy_into(dst: Any, src: Any) -> None:
    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
    else:
        for d, s in zip(dst, src):
            d.copy_(s)


def run_trials(
    op: Any,
    candidates: Sequence[Any],
    args: Sequence[Any],
    settings: Any,
    on_progress: Callable[[int, Any], None] | None = None,
) -> list[Result]:
    """Gate and time every candidate; a failure excludes that candidate, never the run."""
    args = tuple(args)
    tensors = [a for a in args if isinstance(a, torch.Tensor)] + [
        t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)
    ]
    device = tensors[0].device if tensors else torch.device("cpu")
    timer = settings.timer or cuda_timer
    _triton_compiles.watch()  # once per process: compiles in the gates count (``compiled_here``)
    mutated = [i for i, p in enumerate(op.signature.params) if p.mutated]
    with phase("prepare"):  # the oracle's run; every unit of work below is a phase (see _phases)
        start_for_inductor(op, candidates, device)  # its workers start while this prepares
        reference = expected(op, args)
        out_specs = op.dispatcher.output_specs(args) if op.signature.returns != "none" else []
        pristine = {i: _verify.clone(args[i]) for i in mutated}
        own = [(_verify.clone(a) if i in mutated else a) for i, a in enumerate(args)]
        outs = [torch.empty(s, dtype=d, device=dev) for s, d, dev in out_specs]

    def restore(_: int) -> None:  # one argument set (Trial.n_sets == 1)
        for i in mutated:
            _copy_into(own[i], pristine[i])

    results: list[Result | Trial] = []
    started = clock()  # stands still while a tuning off the caller's path is paused
    early: dict[int, Result | Trial] = {}
    inductor = _inductor(op, candidates, device)
    settle_for_inductor(op, candidates, device)  # before any job is made: Inductor would move it mid-way
    built: Summary | None = None  # what the worker pool compiled for this key
    with phase("compile"):  # the candidates' compiles, in worker processes, before any is gated
        if inductor is None:
            built = compile_ahead(op, candidates, (*own, *outs), device)  # the runners' exact arguments: see _gate
        else:  # while the workers compile, Inductor compiles the reference here (seconds, once a shape)
            ahead = Ahead(op, candidates, (*own, *outs), device)
    if inductor is not None:
        with phase("gate", inductor, heavy=_compiles_here(op, inductor, None)):
            early[id(inductor)] = _gate(op, inductor, own, outs, restore if mutated else None, reference, device)
        with phase("compile"):
            built = ahead.result()
            if moved(built):  # Inductor moved Triton's cache meanwhile (see settle_inductor_triton_cache)
                log.info("%s: the compile caches moved while the workers compiled; compiling ahead again", op.name)
                built = compile_ahead(op, candidates, (*own, *outs), device)
    _count_ahead(built)
    for n, cand in enumerate(candidates):
        if on_progress is not None:
            on_progress(n, cand)
        if id(cand) in early:
            result = early[id(cand)]
        elif n > 0 and clock() - started > settings.budget_s:
            results.append(_over_budget(cand, settings))
            continue
        else:
            # compiles here where the pool did not (heavy: it waits for a pause in serving)
            # a kernel's Triton compiles here count in the report (Inductor's, for torch:*, do not)
            counting = contextlib.nullcontext() if _compete.is_torch(cand) else _triton_compiles.counted()
            with phase("gate", cand, heavy=_compiles_here(op, cand, built)), counting:
                result = _gate(op, cand, own, outs, restore if mutated else None, reference, device)
        if isinstance(result, Trial):
            result.cold = bool(settings.cold_l2)
        results.append(result)
    trials = [r for r in results if isinstance(r, Trial)]
    if trials and settings.timer is None:
        with phase("measure"):
            _warm_up(trials[0], device)
    where = {id(r): i for i, r in enumerate(results)}
    times: dict[int, tuple[float, float, float | None]] = {}  # id(trial) -> (score, GPU ms, host ms)
    for n, trial in enumerate(trials):
        spent = clock() - started
        if n > 0 and spent > settings.budget_s:
            results[where[id(trial)]] = _over_budget(trial.candidate, settings)
            continue
        trial.budget_s = max(0.05, (settings.budget_s - spent) / (len(trials) - n))
        with phase("measure", trial.candidate):
            outcome = _time(trial, timer, settings)
        if isinstance(outcome, Result):
            results[where[id(trial)]] = outcome
        else:
            times[id(trial)] = outcome
    with phase("measure"):
        _refine([t for t in trials if id(t) in times], times, timer, settings)
    with phase("host"):
        _served_hosts([t for t in trials if id(t) in times], times, timer)
    if on_progress is not None:
        on_progress(len(candidates), None)
    return [r if isinstance(r, Result) else Result(r.candidate, *_scored(times[id(r)])) for r in results]


def _count_ahead(built: Summary | None) -> None:
    """What the pool did for this key, in the tuning's record (``kg.tune.report``): jobs sent,
    compiled, failed (a failed one compiled again in its gate)."""
    if built is not None:
        count("ahead_jobs", built.jobs)
        count("ahead_compiled", built.compiled)
        count("ahead_failed", built.failed)


def _scored(t: tuple[float, float, float | None]) -> tuple:
    score, gpu, host = t
    return score, None, None, gpu, host


def _over_budget(cand: Any, settings: Any) -> Result:
    return Result(cand, kind="budget", reason=(
        f"not measured: the tuning budget of {settings.budget_s:g}s per key was spent"))


def _warm_up(trial: Trial, device: torch.device, ms: float = WARM_MS) -> None:
    """Launch ``trial`` until the GPU has been busy for ``ms``, so every candidate is timed at the
    GPU's sustained clock (see the module docstring)."""
    if device.type != "cuda":
        return
    with on_device(device):  # the events must be on the device the trial launches on
        _warm_up_on(trial, ms)


def _warm_up_on(trial: Trial, ms: float) -> None:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    batch = 1
    for _ in range(12):  # doubling batches: at most a few hundred ms even for tiny kernels
        start.record()
        for _ in range(batch):
            if trial.restore is not None:
                trial.restore(0)
            trial.run(0)
        end.record()
        end.synchronize()
        took = start.elapsed_time(end)
        ms -= took
        if ms <= 0:
            return
        batch = min(batch * 2, 1 << 12)


def _finalists(trials: list[Trial], times: dict[int, tuple], margin: float, most: int) -> list[Trial]:
    if not trials:
        return []
    best = min(times[id(t)][0] for t in trials)
    return sorted((t for t in trials if times[id(t)][0] <= best * (1.0 + margin)),
                  key=lambda t: times[id(t)][0])[:most]


def _together(finalists: list[Trial], times: dict[int, tuple], timer: Any, settings: Any) -> bool:
    """Score ``finalists`` by one timing of them all, their graphs replayed in turn; False (scores
    unchanged) where the timer cannot time every one of them so."""
    measure = getattr(timer, "together", None)
    if measure is None:
        return False
    try:
        got = measure(finalists, settings, [times[id(t)][1] for t in finalists])
    except Exception as exc:  # the sequential re-timing still decides
        log.debug("finalists not timed together: %s", exc)
        return False
    if len(got) != len(finalists) or any(ms is None or not math.isfinite(ms) or ms <= 0 for ms in got):
        return False
    # The timing in turn orders the finalists; the others keep their first-pass scores, taken at
    # another moment's clock. So the finalists' new scores are put on the first pass's scale (the
    # same sum): a clock that ran slower during the timing in turn does not hand the win to a
    # candidate that was never timed beside them.
    scale = sum(times[id(t)][1] for t in finalists) / sum(got)
    for t, ms in zip(finalists, got):
        times[id(t)] = (float(ms) * scale, float(ms) * scale, None)
    return True


def _refine(trials: list[Trial], times: dict[int, tuple], timer: Any, settings: Any) -> None:
    """Re-time the finalists: together (``_together``), else one after the other ``FINAL_ROUNDS``
    times, each keeping its fastest median."""
    if len(trials) < 2:
        return
    # only GPU-time scores are re-timed together: one that holds a host time (torch:compile's
    # max(GPU, host)) is not a replay's to replace
    wide = _finalists([t for t in trials if times[id(t)][2] is None], times, TOGETHER_MARGIN, MAX_TOGETHER)
    if len(wide) >= 2 and _together(wide, times, timer, settings):
        return
    finalists = _finalists(trials, times, FINAL_MARGIN, MAX_FINALISTS)
    if len(finalists) < 2:
        return
    for _ in range(FINAL_ROUNDS):
        for t in finalists:
            t.budget_s = 0.05
            outcome = _time(t, timer, settings)
            if not isinstance(outcome, Result):
                times[id(t)] = min(times[id(t)], outcome, key=lambda o: o[0])


def _compiles_reference(op: Any, candidates: Sequence[Any]) -> bool:
    """Whether ``candidates`` hold a ``torch:compile`` whose gate will compile (Dynamo has not
    refused the op's reference before)."""
    return op.dispatcher.compile_state.error is None and any(_compete.is_torch_compile(c) for c in candidates)


def settle_for_inductor(op: Any, candidates: Sequence[Any], device: torch.device) -> None:
    """Settle Triton's cache where Inductor will move it (``settle_inductor_triton_cache``) when
    ``candidates`` hold a ``torch:compile`` that will compile."""
    if _compiles_reference(op, candidates):
        settle_inductor_triton_cache(device)


def start_for_inductor(op: Any, candidates: Sequence[Any], device: torch.device) -> None:
    """Start Inductor's compile workers (``start_inductor_workers``) when ``candidates`` hold a
    ``torch:compile`` that will compile; its first use imports Inductor, so call it in a heavy
    unit."""
    if _compiles_reference(op, candidates):
        start_inductor_workers(device)


def _inductor(op: Any, candidates: Sequence[Any], device: torch.device) -> Any:
    """The ``torch:compile`` candidate when its gate (Inductor compiling the reference for this
    shape: seconds) can run while the kernels compile in the worker pool; else None."""
    if not _compiles_reference(op, candidates) or not would_use(op, candidates, device):
        return None
    return next(c for c in candidates if _compete.is_torch_compile(c))


def _compiles_here(op: Any, cand: Any, built: Summary | None) -> bool:
    """Whether gating ``cand`` may compile in this process: a heavy unit (``_pace``), which a
    tuning off the caller's path starts only in a pause of serving (or after a bound). The gate of
    ``torch:compile`` is Inductor compiling the reference for this shape (unless Dynamo refused the
    reference before: then it only says so); ``torch:eager`` compiles nothing. A kernel compiles on
    its first launch here unless the worker pool compiled it for this key (``built``: a job that
    failed compiles again in the gate) or an AOT bundle serves it. A kernel whose compile is cached
    anyway (Triton's disk cache, a specialisation launched before) counts as heavy too: nothing
    cheap tells before its launch, and the mark costs the tuning a wait, never serving."""
    if _compete.is_torch(cand):
        return cand.impl.name == "compile" and op.dispatcher.compile_state.error is None
    if built is not None and built.built_for(cand):
        return False
    return op.dispatcher.bundled_runner(cand.index, cand.config) is None


def _gate(op, cand, own, outs, restore, reference, device) -> Result | Trial:
    """Compile and run ``cand`` once on poisoned outputs and judge them with the oracle: a Trial
    ready to time, or the Result that excludes it."""
    if _compete.is_torch(cand):  # it allocates its outputs itself: called without them
        if restore is not None:
            restore(0)
        return _gate_torch(op, cand, _compete.bind(op, cand), own, restore, reference, device)
    try:
        runner = op.dispatcher.runner(cand)
    except Exception as exc:
        return Result(cand, kind=classify_error(exc.__cause__ or exc), reason=f"{type(exc).__name__}: {exc}")
    if restore is not None:
        restore(0)
    try:
        call = guarded(op, own, outs)  # the caller's tensors are never what a kernel on trial writes
        runner(*call.args, *call.outs)
        _verify.sync(device)
    except Exception as exc:
        kind = classify_error(exc)
        return Result(cand, kind=kind, reason=f"{kind} error: {type(exc).__name__}: {str(exc)[:500]}")
    why = judge(op, reference, call.outs, call.args, call)
    del call
    if why is not None:
        return Result(cand, kind="wrong", reason=why)

    def run(_: int) -> None:
        runner(*own, *outs)

    return Trial(cand, run, restore=restore, device=device)


def _gate_torch(op, cand, call, own, restore, reference, device) -> Result | Trial:
    """The gate for a PyTorch candidate: it allocates its own outputs (as the op's plan will when
    it wins), so those are judged, and the trial times the call as the plan makes it. For
    ``torch:compile`` this first call is the compile (or the recompile for a new shape), done
    here, before any CUDA-graph capture of the timing."""
    fresh, args = op._fresh_outputs, tuple(own)
    failed = op.dispatcher.compile_state.error if cand.impl.name == "compile" else None
    if failed is not None:  # Dynamo refused this reference before: found once, not retried per shape
        return Result(cand, kind="compile", reason=failed)
    # No guarded copies here: this candidate is the reference itself (what the op's declaration
    # says it writes), and a compiled one specializes on its inputs' layout, storage offsets
    # included, so it is compiled on the very tensors it is then timed on.
    try:
        got = fresh(call(*own), empty=False, args=args)
        _verify.sync(device)
    except Exception as exc:
        kind = classify_error(exc)
        if cand.impl.name == "compile" and kind != "memory":  # out of memory is no refusal
            op.dispatcher.compile_state.refused(exc)
            kind = "compile"
        return Result(cand, kind=kind, reason=f"{kind} error: {type(exc).__name__}: {str(exc)[:500]}")
    why = judge(op, reference, _compete.outputs_of(op, got), own)
    del got
    if why is not None:
        return Result(cand, kind="wrong", reason=why)

    def run(_: int) -> None:
        fresh(call(*own), empty=False, args=args)

    # A reference that cannot be captured must not win over kernels that can (see _timing).
    return Trial(cand, run, restore=restore, device=device, must_capture=True)


def _time(trial: Trial, timer: Any, settings: Any) -> tuple[float, float, float | None] | Result:
    """(score, GPU ms, host ms per call) of one trial, or the Result that excludes it."""
    cand = trial.candidate
    try:
        ms = float(timer(trial, settings))
    except CaptureRefused as exc:
        return Result(cand, kind="capture", reason=f"cannot be captured in a CUDA graph: {exc}")
    except Exception as exc:
        kind = "memory" if out_of_memory(exc) else "timing"
        return Result(cand, kind=kind, reason=f"timing failed: {type(exc).__name__}: {str(exc)[:300]}")
    finally:
        if trial.restore is not None:
            for k in range(trial.n_sets):
                trial.restore(k)
    if not math.isfinite(ms) or ms < 0:
        return Result(cand, kind="timing", reason=f"timing gave {ms!r}")
    if not _compete.is_torch(cand):
        return ms, ms, None  # its host time is measured after every timing (_served_hosts)
    host = _host(trial, timer) if cand.impl.name == "compile" else None
    if host is not None:
        # GPU time alone ranks torch:compile as if its calls cost the host nothing: each runs
        # Dynamo's guards and Inductor's wrapper, tens of microseconds (on the H200 a compiled
        # rmsnorm_residual reference won a 17 us prefill shape by GPU time, then cost ~200 us per
        # call in an eager stream of calls). Scored by max(GPU, host): the time a call takes in a
        # stream of calls. Under an outer torch.compile the op gives way to its traced reference
        # instead (graft._inline), where that host cost is gone.
        return max(ms, host), ms, host
    # torch:eager is ranked by GPU time, as kernels are: only a reference that is one library
    # call (a cuBLAS GEMM) beats a kernel on the GPU, and that costs the host about what a launch
    # does. Scoring its host time but not the kernels' lost cuBLAS to Triton GEMMs up to 24%
    # slower on skinny shapes (H200, benchmarks/results/2026-12-02-h200-1). Its host time is
    # measured after every timing and recorded beside the score (_served_hosts).
    return ms, ms, None


def _host(trial: Trial, timer: Any) -> float | None:
    """Host milliseconds per call, where the timer measures them (``timer.host_ms``)."""
    measure = getattr(timer, "host_ms", None)
    if measure is None:
        return None
    try:
        return float(measure(trial))
    except Exception as exc:  # the GPU time still ranks it
        log.debug("host cost of %s not measured: %s", trial.candidate, exc)
        return None


def _served_hosts(trials: list[Trial], times: dict[int, tuple], timer: Any) -> None:
    """The host time per call of each kernel that can rank first, and of the eager reference,
    recorded beside the GPU time, not scored: the in-graph choice weighs the first-ranked
    candidate's (graft._inline). Measured after all GPU timings, so the host-bound loops (and
    their idle GPU) never come between two candidates' timings."""
    ranked = [t for t in trials if _compete.find(t.candidate.impl) != "compile"]  # kernels and torch:eager
    if not ranked:
        return
    best = min(times[id(t)][0] for t in ranked)
    for t in ranked:  # the ones that can rank first (within the finalists' margin), not every config
        score, gpu, host = times[id(t)]
        if host is None and score <= best * (1.0 + FINAL_MARGIN):
            times[id(t)] = (score, gpu, _host(t, timer))
