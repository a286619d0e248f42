"""Checks in a child process, so that a kernel that kills its process is that kernel's failure.

A Triton kernel that stores past the end of its output corrupts the heap under the interpreter
(a segfault or ``corrupted size vs. prev_size``, SIGABRT); on a GPU an illegal address leaves the
CUDA context unusable for every later kernel. Either way the process that ran it is done for.

Design, for a cheap healthy case: one worker process checks the ops one after another and streams
every result back over a pipe, announcing each step (a candidate on a sample, the reference, the
metadata check, opcheck) before it runs it. A run without crashes pays one process start: a fork
(milliseconds; the worker inherits the imported ops) while the parent has not initialised CUDA,
else a spawn that re-imports the targets (fork is unsafe once CUDA is initialised). When the
worker dies, the step it announced last names the culprit: that step becomes a failure row with
the signal or exit status and the sample, the candidate is left out of the op's remaining
samples, and a new worker resumes after the steps already reported. A CUDA error that leaves the
context unusable is caught in the worker: it reports the candidate and exits, so the next
candidate gets a fresh context.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import multiprocessing
import os
import signal
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._harness import SAMPLES_KEY, CheckOptions, CheckReport, Key, Result, iter_check
from ._progress import Events

__all__ = ["check_isolated", "check_in_process", "start_method"]

log = logging.getLogger(__name__)

_LOST = 3  # the worker's exit status after a CUDA error that leaves the context unusable


@dataclasses.dataclass
class _OpState:
    """What the parent knows of one op across workers."""

    done: set[Key] = dataclasses.field(default_factory=set)
    excluded: set[str] = dataclasses.field(default_factory=set)
    finished: bool = False
    started: bool = False
    results: list[Result] = dataclasses.field(default_factory=list)


def start_method() -> str:
    """fork while this process has no CUDA context (cheap, inherits the ops), else spawn."""
    if "fork" in multiprocessing.get_all_start_methods() and not torch.cuda.is_initialized():
        return "fork"
    return "spawn"


def _context_lost() -> bool:
    """After a failed CUDA kernel: is this process's CUDA context still usable?"""
    if not torch.cuda.is_initialized():
        return False
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
    except Exception:  # a sticky error (illegal address, launch failure): every later call fails too
        return True
    return False


def _load_ops(targets: Sequence[str], names: Sequence[str]) -> list[Any]:
    """In a spawned worker: import the targets (skipping what is already registered) and find the
    ops by name."""
    from .._op import _registry

    missing = [name for name in names if _registry.lookup(name) is None]
    if missing:
        from ..cli._common import load_target

        for target in targets:
            if target.endswith(".py") or os.path.isfile(target):
                load_target(target)
            else:
                importlib.import_module(target)
    ops = [_registry.lookup(name) for name in names]
    absent = [name for name, op in zip(names, ops) if op is None]
    if absent:
        raise RuntimeError(f"importing {list(targets)} in the check process did not define {absent}")
    return ops


def _worker(conn, ops, targets, names, options: CheckOptions, states, prepare) -> None:
    if prepare is not None:
        prepare()
    try:
        if ops is None:
            ops = _load_ops(targets, names)
        for index, (op, (done, excluded, finished)) in enumerate(zip(ops, states)):
            if finished:
                continue
            conn.send(("op", index))
            steps = iter_check(op, options, done=done, excluded=excluded,
                               announce=lambda key, sample, variant: conn.send(("step", key, sample, variant)))
            for key, result in steps:
                if result.status == "fail" and key[2] not in ("meta", "opcheck") and _context_lost():
                    note = (f"{result.note}; this left the CUDA context unusable: its remaining samples "
                            "were not run, the check went on in a fresh process")
                    conn.send(("result", key, dataclasses.replace(result, note=note)))
                    conn.send(("lost", key))
                    conn.close()
                    os._exit(_LOST)
                conn.send(("result", key, result))
            conn.send(("op_done", index))
    except BaseException:  # noqa: BLE001 - anything here is reported by the parent, not swallowed
        conn.send(("error", traceback.format_exc(limit=8)))
    conn.close()


def _how(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "unknown signal"
        return f"killed by {name} (signal {-exitcode})"
    return f"exit status {exitcode}"


def _crash_row(op: Any, state: _OpState, step: tuple | None, exitcode: int | None) -> Result:
    """The failure row for a worker that died while running ``step`` of ``op``; updates ``state``
    so the next worker does not run it again."""
    how = _how(exitcode)
    hint = "; rerun with --no-isolate (or check_op(isolate=False)) to debug it in process"
    if step is None:
        state.finished = True
        return Result(op.name, "-", "-", "-", "fail", float("inf"),
                      note=f"the check process died ({how}) between two steps of this op{hint}")
    key, sample, variant = step
    state.done.add(key)
    label = key[2]
    if key == SAMPLES_KEY:
        state.finished = True
        return Result(op.name, "-", "-", "-", "fail", float("inf"),
                      note=f"sample_inputs crashed the check process ({how}){hint}")
    if label == "reference":
        state.finished = True
        return Result(op.name, "reference", sample, variant, "fail", float("inf"),
                      note=f"the reference (or the op's meta or supports functions) crashed the check "
                           f"process ({how}); the op's other samples were not run{hint}")
    state.excluded.add(label)
    return Result(op.name, label, sample, variant, "fail", float("inf"),
                  note=f"crashed the check process ({how}); its other samples were not run{hint}")


def _targets_of(ops: Sequence[Any]) -> list[str]:
    """Modules a spawned worker imports to define ``ops`` (the modules of their references)."""
    return list(dict.fromkeys(op.reference.__module__ for op in ops))


def check_isolated(
    ops: Sequence[Any],
    options: CheckOptions = CheckOptions(),
    *,
    targets: Sequence[str] | None = None,
    events: Events | None = None,
    prepare: Callable[[], None] | None = None,
) -> CheckReport:
    """Check ``ops`` in a worker process (see the module docstring), restarting it after a crash.

    ``targets`` (files or modules) define the ops for a spawned worker; by default the modules of
    the ops' references. ``prepare`` runs first in every worker (a module-level function, so a
    spawned worker can receive it). ``events`` hears of ops and results as they come.
    """
    events = events or Events()
    states = [_OpState() for _ in ops]
    method = start_method()
    ctx = multiprocessing.get_context(method)
    targets = list(targets) if targets is not None else _targets_of(ops)
    names = [op.name for op in ops]
    while not all(s.finished for s in states):
        receive, send = ctx.Pipe(duplex=False)
        frozen = [(frozenset(s.done), frozenset(s.excluded), s.finished) for s in states]
        worker = ctx.Process(
            target=_worker, daemon=True, name="kernelgraft-check",
            args=(send, list(ops) if method == "fork" else None, targets, names, options, frozen, prepare),
        )
        worker.start()
        send.close()  # the worker holds the only writing end: its death is our EOF
        current, step, lost, error = None, None, False, None
        while True:
            try:
                message = receive.recv()
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "op":
                current, step = message[1], None
                if not states[current].started:
                    states[current].started = True
                    events.op_started(ops[current].name, current, len(ops))
            elif kind == "step":
                step = message[1:]
            elif kind == "result":
                states[current].done.add(message[1])
                states[current].results.append(message[2])
                events.result(message[2])
                step = None
            elif kind == "lost":
                states[current].excluded.add(message[1][2])
                lost = True
            elif kind == "op_done":
                states[current].finished = True
                events.op_finished(ops[current].name, states[current].results)
                current = None
            elif kind == "error":
                error = message[1]
        receive.close()
        worker.join()
        log.debug("check worker (%s) ended with %s", method, _how(worker.exitcode))
        if error is not None or (current is None and not lost and not all(s.finished for s in states)):
            # The worker failed outside any op's check (importing the targets, say): every op it
            # did not finish fails with its message rather than restarting forever.
            note = (f"the check process failed: {error.strip().splitlines()[-1]}" if error else
                    f"the check process died ({_how(worker.exitcode)}) before checking this op")
            log.debug("check worker error:\n%s", error)
            for op, state in zip(ops, states):
                if not state.finished:
                    state.finished = True
                    row = Result(op.name, "-", "-", "-", "fail", float("inf"), note=note)
                    state.results.append(row)
                    events.result(row)
            break
        if current is not None and not lost:
            row = _crash_row(ops[current], states[current], step, worker.exitcode)
            log.debug("%s: %s", ops[current].name, row.note)
            states[current].results.append(row)
            events.result(row)
            if states[current].finished:
                events.op_finished(ops[current].name, states[current].results)
    return CheckReport([r for state in states for r in state.results])


def check_in_process(ops: Sequence[Any], options: CheckOptions = CheckOptions(), *,
                     events: Events | None = None) -> CheckReport:
    """Check ``ops`` in this process, with the same events as ``check_isolated``."""
    events = events or Events()
    report = CheckReport()
    for index, op in enumerate(ops):
        events.op_started(op.name, index, len(ops))
        results = []
        for _, result in iter_check(op, options):
            results.append(result)
            events.result(result)
        events.op_finished(op.name, results)
        report.results.extend(results)
    return report
