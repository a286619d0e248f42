"""The tuner's side of tuning off the caller's path: when it applies, what the call gets, the job.

A key without a decision in memory is looked up on disk first (as inside a call); without one, a
job tunes it on the device's worker (``_background``) and the call is served at once by the
provisional choice (``_meanwhile``), marked so (``_select.provisional`` with the job's
``Pending``): the op keeps that plan, without a native replay, until the decision lands, then plans
again. Every thread and shape that meets the key shares the one job. A key the queue refuses is
served the same way for ``SKIP_RETRY_S``, then asked again.

Tuned inside the call as before: ``blocking=True`` (or ``KERNELGRAFT_TUNE_BLOCKING=1``), tensors off
CUDA unless ``blocking=False``, ranks that agree through torch.distributed (their agreement is made
on the caller's thread, in the order its calls meet keys), an op whose reference cannot run (a
bundle's stand-in: nothing to serve meanwhile), and a device whose worker could not start. Nothing
is queued while a CUDA graph is captured or torch.compile traces: the tuner's ``may_measure``
refuses first.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from ..op import select as _select
from ..op.compete import is_torch_compile, servable
from . import compile_jobs as _compile_jobs, compile_pool as _compile_pool, dist as _dist, phases as _phases
from .background import Job
from .inputs import tensors_of
from .key import TuneKey
from .meanwhile import meanwhile
from .trials import settle_for_inductor, start_for_inductor
from ..op.modes import Settings

__all__ = ["off_path", "serve", "SKIP_RETRY_S"]

log = logging.getLogger(__name__)
SKIP_RETRY_S = 1.0  # a key the queue refused asks again after this long


def off_path(tuner: Any, op: Any, args: tuple, s: Settings) -> bool:
    """Whether a new key of this call is tuned off the caller's path (else inside the call)."""
    if s.mode != "on" or s.blocking is True:
        return False
    first = next(tensors_of(args), None)
    if first is None or (s.blocking is None and first.device.type != "cuda"):
        return False
    if s.distributed and _dist.active():
        return False
    return not getattr(op.reference, "kernelgraft_stub", False) and tuner.background.usable(first.device)


def serve(tuner: Any, op: Any, candidates: Sequence[Any], args: tuple, key: TuneKey, s: Settings) -> Any:
    """The candidate for this call of a key with no decision in memory (None: the reference)."""
    found = tuner.resolve_locked(op, candidates, args, key, s, False)  # the disk cache, or the default
    usable = servable(op, candidates)
    if found.source != "default":
        return tuner.pick(op, found, usable)
    first = next(tensors_of(args))
    pending = tuner.background.submit(key.digest, key.fingerprint, first.device, args,
                                      _job(tuner, op, candidates, key, s, queued_by_a_call=True),
                                      f"{op.name} ({key.summary()})")
    if pending is None:  # not queued (the background counts it): ask again after a while
        _select.provisional(time.monotonic() + SKIP_RETRY_S)
    else:
        _select.provisional(pending)
    return meanwhile(op, usable, args, key.as_json(), list(tuner.memory.values()))


def _first_fake_tensors() -> bool:
    """Whether this process has yet to make fake tensors: their first use imports
    ``torch._dynamo`` and much of torch with it."""
    return "torch._dynamo" not in sys.modules


FIRST_CALL_WAIT_S = 2.0  # the most a job waits for the call that queued it to return


def _after_the_first_call(job: Job) -> None:
    """Return once the call that queued ``job`` has been served (its plan returned: ``Pending.served``),
    or after ``FIRST_CALL_WAIT_S``. That call runs the reference while the job would start: a
    process's first tuning imports for seconds (fake tensors, the compile workers' start) and
    would take the GIL from it; a probe of a few milliseconds (``pace``) can miss a call that
    has just begun. Then the job paces itself as any tuning does."""
    deadline = time.monotonic() + FIRST_CALL_WAIT_S
    pending = job.pending
    while not (pending.served or pending.landed) and time.monotonic() < deadline:
        time.sleep(0.002)


def _first_pass(op: Any, candidates: Sequence[Any], pooled: bool) -> list | None:
    """The candidates of a first decision, when there is one to make: all but ``torch:compile``,
    whose gate (Inductor compiling the reference: seconds, and most of a new key's tuning) then
    runs in the second pass. None when it is not among the candidates, fewer than two are left, or
    the compile workers compile the kernels (``pooled``): then ``torch:compile``'s gate runs while
    the workers start and compile, and one pass decides among them all sooner than two would. In
    a warmed process the workers are the wait (on the H200 a warmed rmsnorm key waited 1.5 s for
    them and a second pass took 2 s more); in a cold one, Inductor's imports and first compile
    (about 4 s on the H200's host) are, and the workers' own start (about 5 s) overlaps them
    instead of coming before them. Where the kernels compile here, in their gates, a first
    decision lands without waiting for Inductor."""
    rest = [c for c in candidates if not is_torch_compile(c)]
    if len(rest) == len(candidates) or len(rest) < 2 or op.dispatcher.compile_state.error is not None:
        return None
    return None if pooled else rest


def _land_first(tuner: Any, op: Any, first: list, job: Job, key: TuneKey, s: Settings,
                phases: _phases.Phases) -> Any:
    """Decide among ``first`` and land that decision now: the ops plan with it (kept until the
    whole tuning lands, which then replaces it: ``refining``); None when nothing landed."""
    decision = tuner.measure_first(op, first, job.args, key, s)
    if decision is None:
        return None
    final = _select.Pending()
    decision.refining = final
    tuner.memory[key.digest] = decision  # before the landing: a call that replans finds it
    waiting, job.pending = job.pending, final
    phases.add("first_landing", time.perf_counter() - job.enqueued)
    waiting.land()
    return decision


def _warming(candidates: Sequence[Any], device: torch.device) -> threading.Thread:
    """A thread computing what the candidates' first launches in this process compute once
    (``compile_jobs.warm_launches``: best effort, it never raises), started."""
    thread = threading.Thread(target=_compile_jobs.warm_launches, args=(candidates, device),
                              name="kernelgraft-warm-launches", daemon=True)
    thread.start()
    return thread


def _job(tuner: Any, op: Any, candidates: Sequence[Any], key: TuneKey, s: Settings,
         queued_by_a_call: bool = False) -> Any:
    """What the worker runs for the key: the tuning a call would make, on the copied inputs, in
    the caller's context (its ``kg.tune`` settings), paced, without a progress bar; after the
    call that queued it returned (``queued_by_a_call``: ``_after_the_first_call``)."""
    context = contextvars.copy_context()
    settings = dataclasses.replace(s, progress=False, blocking=True)

    def run(job: Job) -> None:
        pacer = tuner.background.pacer(job)
        phases = _phases.Phases(pacer)
        phases.add("queued", (job.started or job.enqueued) - job.enqueued)
        if queued_by_a_call:
            waited = time.perf_counter()
            _after_the_first_call(job)
            phases.paused_s += time.perf_counter() - waited
        # before any job is made: the jobs compile where the gates will look once Inductor has
        # compiled (a first pass leaves torch:compile to the second)
        settle_for_inductor(op, candidates, torch.device(job.device))
        pooled = _compile_pool.would_use(op, candidates, torch.device(job.device))  # the workers compile
        waited = time.perf_counter()
        pacer.before()  # the job's start (the device lock, the disk cache) in a quiet window too
        try:
            if pooled:
                _compile_pool.prestart([op])  # the workers import torch, Triton and the op while the job prepares
        except Exception:  # the pool starts again when the compile phase asks; the job goes on
            log.debug("starting the compile workers ahead failed", exc_info=True)
        pacer.after()
        phases.paused_s += time.perf_counter() - waited
        with phases.recording(), torch.no_grad():
            # the checks planning skipped for the call served meanwhile (``op.outputs``): inputs
            # that do not fit raise the caller's InputError here, before anything is tuned. A paced
            # unit: a process's first fake tensors import much of torch (seconds of Python on the
            # GIL), which must not run beside the call that queued the job: heavy until they have
            with _phases.phase("prepare", heavy=_first_fake_tensors() or pooled):
                # while the workers compile, what the first gate would pay (a second, cold: a
                # subprocess and file hashes, mostly off the GIL), beside the fake tensors' imports
                warming = _warming(candidates, torch.device(job.device)) if pooled else None
                try:
                    # Inductor's compile workers start beside the fake tensors' imports, to be
                    # ready when torch:compile's gate compiles the reference's kernels
                    start_for_inductor(op, candidates, torch.device(job.device))
                    context.run(op.dispatcher.output_specs, job.args)
                finally:
                    if warming is not None:
                        warming.join()
            first = _first_pass(op, candidates, pooled)
            landed = None
            if first is not None:
                landed = context.run(_land_first, tuner, op, first, job, key, settings, phases)
            final = context.run(tuner.resolve, op, candidates, job.args, key, settings)
            if landed is not None and final.source == "default":
                tuner.memory[key.digest] = landed  # the whole tuning failed: the first decision stays
                landed.refining = None
        tuner.stats["background_tuned"] += 1

    return run
