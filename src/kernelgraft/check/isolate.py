"""Checks in a child process, so that a kernel that kills its process is that kernel's failure.

A Triton kernel that stores past the end of its output corrupts the heap under the interpreter
(a segfault or ``corrupted size vs. prev_size``, SIGABRT); on a GPU an illegal address leaves the
CUDA context unusable for every later kernel. Either way the process that ran it is done for.

Design, for a cheap healthy case: one worker process checks the ops one after another and streams
every result back over a pipe, announcing each step (a candidate on a sample, the reference, the
metadata check, opcheck) before it runs it. A run without crashes pays one process start: a fork
(milliseconds; the worker inherits the imported ops) where no GPU is visible, else a spawn that
re-imports the targets (a few seconds). Fork is not an option once this process has asked the
CUDA driver anything, which ``torch.cuda.is_available()`` already does: CUDA then fails in the
child with an initialization error. When the
worker dies, the step it announced last names the culprit: that step becomes a failure row with
the signal or exit status and the sample, the candidate is left out of the op's remaining
samples, and a new worker resumes after the steps already reported. A CUDA error that leaves the
context unusable is caught in the worker: it reports the candidate and exits, so the next
candidate gets a fresh context.

Blame is checked, not assumed: memory corrupted by one kernel may bring the process down only in
a later step (guarded memory catches an overrun of its guards, but not a wild store). So the step
the worker died on is re-run alone in a fresh worker first, the reference's step too (it runs the
reference, the op's meta and ``supports`` functions, never a kernel); if it survives there, each
candidate that ran before it in the dead worker (same op) is re-run alone with that step after it,
one per worker, and the one that dies is named. A crash that no step reproduces alone is the op's
failure, charged to no candidate. Only a crash pays for this.

Verdicts are honest: the steps a worker announced for a variant and that never ran (the op's
check ended early) are "notrun" rows, so a candidate is ``ok`` only if every step of it ran.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import signal
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from . import worker as _worker
from .harness import SAMPLES_KEY, CheckOptions, CheckReport, Key, Plan, Result, iter_check
from .progress import Events

__all__ = ["check_isolated", "check_in_process"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _OpState:
    """What the parent knows of one op across workers."""

    done: set[Key] = dataclasses.field(default_factory=set)
    excluded: set[str] = dataclasses.field(default_factory=set)
    planned: dict[Key, tuple[str, str]] = dataclasses.field(default_factory=dict)  # -> (sample, variant)
    crashes: dict[Key, int] = dataclasses.field(default_factory=dict)  # crashes no step repeats alone
    finished: bool = False
    started: bool = False
    results: list[Result] = dataclasses.field(default_factory=list)

    def plan(self, only: Iterable[Key] | None = None) -> Plan:
        failed = frozenset(r.candidate for r in self.results if r.status == "fail")
        return Plan(frozenset(self.done), frozenset(self.excluded), None if only is None else frozenset(only),
                    failed)


@dataclasses.dataclass
class _Session:
    """One worker's run as the parent saw it."""

    exitcode: int | None = None
    current: int | None = None  # the op being checked when the stream ended
    step: tuple | None = None  # (key, sample, variant) announced and not finished
    lost: bool = False  # the worker ended after a CUDA error left its context unusable
    error: str | None = None  # the worker failed outside any step (importing the targets, say)
    ran: dict[int, list[Key]] = dataclasses.field(default_factory=dict)  # op -> keys finished
    hung: float | None = None  # stopped after this many seconds without a message

    @property
    def died(self) -> bool:
        return self.error is None and not self.lost and self.current is not None

    def verb(self) -> str:
        return "hung" if self.hung is not None else "crashed"

    def how(self) -> str:
        if self.hung is not None:
            return f"no result in {self.hung:g} s, so it was stopped"
        return _how(self.exitcode)


def _how(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "an unknown signal"
        return f"killed by {name} (signal {-exitcode})"
    return f"exit status {exitcode}"


_OWN = ("reference", "meta", "opcheck", "trace", "-")  # steps that are not a candidate's
_HINT = "; rerun with --no-isolate (or check_op(isolate=False)) to debug it in process"


def _targets_of(ops: Sequence[Any]) -> list[str]:
    """Modules a spawned worker imports to define ``ops`` (the modules of their references)."""
    return list(dict.fromkeys(op.reference.__module__ for op in ops))


class _Runner:
    def __init__(self, ops, options, targets, events, prepare, step_timeout) -> None:
        self.ops, self.options, self.events, self.prepare = list(ops), options, events, prepare
        self.step_timeout = step_timeout
        self.states = [_OpState() for _ in self.ops]
        self.method = _worker.start_method()
        self.ctx = multiprocessing.get_context(self.method)
        self.targets = list(targets) if targets is not None else _targets_of(self.ops)
        self.names = [op.name for op in self.ops]
        self.where: dict[Key, tuple[str, str]] = {}  # (sample, variant) of every step announced

    # ------------------------------------------------------------------ one worker
    def session(self, plans: list[Plan | None], record: bool = True, whole: bool = True) -> _Session:
        """Run a worker over ``plans`` (None: skip that op) to its end. With ``record``, results go
        into the states and events as they stream in; with ``whole`` (plans that run the rest of
        each op, not a few steps), so do the ops it finishes."""
        receive, send = self.ctx.Pipe(duplex=False)
        worker = self.ctx.Process(
            target=_worker.worker, daemon=True, name="kernelgraft-check",
            args=(send, self.ops if self.method == "fork" else None, self.targets, self.names, self.options,
                  plans, self.prepare),
        )
        worker.start()
        send.close()  # the worker holds the only writing end: its death is our EOF
        out = _Session()
        while True:
            try:
                if self.step_timeout and not receive.poll(self.step_timeout):
                    # a kernel that never ends, or a process spinning in a corrupted heap
                    out.hung = self.step_timeout
                    worker.kill()
                    break
                message = receive.recv()
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "op":
                out.current, out.step = message[1], None
                state = self.states[out.current]
                if record and not state.started:
                    state.started = True
                    self.events.op_started(self.names[out.current], out.current, len(self.ops))
            elif kind == "planned":
                if record:
                    for key in message[1]:
                        self.states[out.current].planned[key] = (message[2], message[3])
            elif kind == "step":
                out.step = message[1:]
                self.where[message[1]] = message[2:]
            elif kind == "result":
                out.ran.setdefault(out.current, []).append(message[1])
                out.step = None
                if record:
                    self._record(out.current, message[1], message[2])
            elif kind == "lost":
                self.states[out.current].excluded.add(message[1][2])
                out.lost = True
            elif kind == "op_done":
                if record and whole:
                    self._finish(out.current)
                out.current = None
            elif kind == "error":
                out.error = message[1]
        receive.close()
        worker.join()
        out.exitcode = worker.exitcode
        log.debug("check worker (%s) ended with %s", self.method, _how(worker.exitcode))
        return out

    def _record(self, index: int, key: Key, result: Result) -> None:
        state = self.states[index]
        state.done.add(key)
        state.results.append(result)
        self.events.result(result)

    def _finish(self, index: int) -> None:
        """The op's check is over: a step announced and never run is a "notrun" row (its candidate
        is not ok), except for candidates already failed (their row says what stopped them)."""
        state = self.states[index]
        if state.finished:
            return
        failed = {r.candidate for r in state.results if r.status == "fail"}
        for key, (sample, variant) in state.planned.items():
            if key not in state.done and key[2] not in failed:
                self._record(index, key, Result(self.names[index], key[2], sample, variant, "notrun", note=(
                    "not run: the check of this op ended before this step (see its other rows)")))
        state.finished = True
        self.events.op_finished(self.names[index], state.results)

    def _alone(self, index: int, keys: Iterable[Key], record: bool) -> _Session:
        plans: list[Plan | None] = [None] * len(self.ops)
        plans[index] = self.states[index].plan(only=keys)
        if not record:  # a re-run of steps already reported: run them although they are done
            plans[index] = Plan(only=frozenset(keys))
        return self.session(plans, record=record, whole=False)

    # ------------------------------------------------------------------ the run
    def run(self) -> CheckReport:
        while not all(s.finished for s in self.states):
            out = self.session([None if s.finished else s.plan() for s in self.states])
            if out.error is not None or (out.current is None and not out.lost
                                         and not all(s.finished for s in self.states)):
                self._give_up(out)
                break
            if out.died:
                self._blame(out)
        return CheckReport([r for state in self.states for r in state.results])

    def _give_up(self, out: _Session) -> None:
        """The worker failed outside any op's check: every op it did not finish fails with its
        message, rather than restarting forever."""
        log.debug("check worker error:\n%s", out.error)
        note = (f"the check process failed: {out.error.strip().splitlines()[-1]}" if out.error else
                f"the check process died ({out.how()}) before checking this op")
        for index, state in enumerate(self.states):
            if not state.finished:
                self._record(index, SAMPLES_KEY, Result(self.names[index], "-", "-", "-", "fail",
                                                        float("inf"), note=note))
                self._finish(index)

    def _blame(self, out: _Session) -> None:
        """The worker died in op ``out.current`` during ``out.step``: find the step that crashes
        alone and charge it, and make sure the next worker does not run it again."""
        index, how = out.current, out.how()
        name, state = self.names[index], self.states[index]
        if out.step is None:
            self._record(index, SAMPLES_KEY, Result(name, "-", "-", "-", "fail", float("inf"),
                                                    note=f"the check process died ({how}) between two steps{_HINT}"))
            return self._finish(index)
        key, sample, variant = out.step
        label = key[2]
        if key == SAMPLES_KEY:  # nothing of the op can run without its samples
            self._record(index, key, Result(name, "-", sample, variant, "fail", float("inf"), note=(
                f"sample_inputs (or deriving inputs from its samples) {out.verb()} the check process "
                f"({how}){_HINT}")))
            return self._finish(index)
        again = self._alone(index, [key], record=True)
        if again.died and again.step is not None and again.step[0] == key:
            if label == "reference":  # no kernel runs in this step: the op's own code crashed
                self._record(index, key, Result(name, "reference", sample, variant, "fail", float("inf"), note=(
                    f"the reference (or the op's meta or supports functions) {again.verb()} the check process "
                    f"({again.how()}), again when run alone in a fresh process{_HINT}")))
                return None
            return self._crashed(index, key, f"{again.verb()} the check process ({again.how()}), again when "
                                             "run alone in a fresh process")
        # It survives alone: an earlier step of the dead worker corrupted memory and this one tripped
        # over it. Re-run each earlier candidate of the op with this step after it, one per worker.
        earlier = [k for k in out.ran.get(index, []) if k[2] != label and k[2] not in _OWN]
        for suspect in dict.fromkeys(k[2] for k in earlier):
            keys = [k for k in earlier if k[2] == suspect]
            trial = self._alone(index, keys + [key], record=False)
            if not trial.died or trial.step is None:
                continue
            if trial.step[0] != key:  # it crashed on its own this time
                return self._crashed(index, trial.step[0], f"{trial.verb()} the check process ({trial.how()}) "
                                                           "when run alone in a fresh process")
            ran = [k for k in trial.ran.get(index, []) if k[2] == suspect]
            return self._crashed(index, (ran or keys)[-1], (
                f"corrupts memory: the check process died ({how}) later, on {label} {sample} ({variant}), "
                f"and again ({trial.how()}) when only this candidate and that step ran in a fresh "
                "process"))
        # Nothing crashes alone: charged to no candidate, and the check goes on (what ran before
        # the crash is done, so the next worker does not repeat that sequence).
        row = Result(name, "-", sample, variant, "fail", float("inf"), note=(
            f"the check process died ({how}) on {label} {sample} ({variant}), but neither that step nor an "
            f"earlier candidate crashes alone: a kernel of this op may corrupt memory without crashing{_HINT}"))
        state.results.append(row)
        self.events.result(row)
        state.crashes[key] = state.crashes.get(key, 0) + 1
        if key in state.done or (label == "reference" and state.crashes[key] < 2):
            return None  # it ran to its end alone, or the next worker runs it again (once)
        self._record(index, key, Result(name, label, sample, variant, "notrun", note=(
            f"not run to its end: the check process died on it ({how}), and it does not crash alone{_HINT}")))

    def _crashed(self, index: int, key: Key, what: str) -> None:
        """``key``'s candidate is the culprit: a failure row, and no more runs of it."""
        sample, variant = self.where.get(key, ("-", "-"))
        state = self.states[index]
        state.excluded.add(key[2])
        # a result it reported for this step before (a corrupted run can still compute right) goes
        state.results = [r for r in state.results if (r.candidate, r.sample, r.variant) != (key[2], sample, variant)]
        self._record(index, key, Result(self.names[index], key[2], sample, variant, "fail", float("inf"),
                                        note=f"{what}; its other samples were not run{_HINT}"))


def check_isolated(
    ops: Sequence[Any],
    options: CheckOptions = CheckOptions(),
    *,
    targets: Sequence[str] | None = None,
    events: Events | None = None,
    prepare: Callable[[], None] | None = None,
    step_timeout: float | None = 600.0,
) -> CheckReport:
    """Check ``ops`` in a worker process (see the module docstring), restarting it after a crash.

    ``targets`` (files or modules) define the ops for a spawned worker; by default the modules of
    the ops' references. ``prepare`` runs first in every worker (a module-level function, so a
    spawned worker can receive it). ``events`` hears of ops and results as they come. A worker
    that sends nothing for ``step_timeout`` seconds (one step: a candidate on one sample, its
    compile included) is stopped and that step is its failure; None waits forever.
    """
    return _Runner(ops, options, targets, events or Events(), prepare, step_timeout).run()


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

