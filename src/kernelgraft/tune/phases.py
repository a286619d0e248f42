"""Where a tuning's time goes, and the one place its work yields to the calls it must not slow.

A tuning is a row of units of work: preparing the oracle, compiling candidates ahead (a compile
phase, where one runs), gating a candidate (its compile happens there for backends that compile on
first launch), timing a candidate, re-timing the finalists, measuring host costs. The trials enter
each unit through ``phase(name, candidate)``. That records the seconds per phase and per candidate
(``kg.tune.report``) and, for a tuning made off the caller's path, first asks the job's pacer
whether the unit may start now (``kernelgraft.tune.pace``); a unit that compiles in this process
says so (``heavy=True``) and waits for a pause in serving. A pause is recorded apart
(``paused``) and is not spent from the tuning budget: the trials read their elapsed time from
``clock()``, which stands still while paused. Outside a recording every function here is a no-op
(``clock`` is ``time.perf_counter``), so a tuning on the caller's thread behaves as before.

>>> rec = Phases()
>>> with rec.recording():
...     with phase("gate", "a"):
...         pass
>>> sorted(rec.seconds), sorted(rec.of("a"))
(['gate'], ['gate'])
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

__all__ = ["Phases", "Pace", "phase", "clock", "current", "count"]

_local = threading.local()


class Pace(Protocol):
    """What a recording asks before and after each unit (``_pace.Pacer``)."""

    def before(self, heavy: bool = False) -> None: ...  # may wait, or raise to stop the tuning

    def after(self) -> None: ...


class Phases:
    """One tuning's seconds by phase (``seconds``) and by candidate (``of``), its pause, and the
    pacer its units ask (None: they start at once)."""

    def __init__(self, pace: Pace | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.paused_s = 0.0
        self.pace = pace
        self.counts: dict[str, float] = {}  # what a unit counted (``count``): the compile-ahead jobs
        self._by_candidate: dict[Any, dict[str, float]] = {}
        self._depth = 0

    @contextlib.contextmanager
    def recording(self) -> Iterator["Phases"]:
        """Make this the current thread's recording for the block."""
        outer = getattr(_local, "current", None)
        _local.current = self
        try:
            yield self
        finally:
            _local.current = outer

    def of(self, candidate: Any) -> dict[str, float]:
        """Seconds by phase spent on ``candidate`` (empty if none)."""
        return dict(self._by_candidate.get(candidate, {}))

    def totals(self) -> dict[str, float]:
        """Seconds by phase and the counts (``count``), with ``paused`` when units waited (and ``units_under_load``, a count,
        when some started while serving was busy; ``heavy_under_load`` of those compiled in this
        process after waiting out the pacer's bound), rounded for storage."""
        out = {name: round(s, 6) for name, s in self.seconds.items()}
        out.update(self.counts)
        if self.paused_s:
            out["paused"] = round(self.paused_s, 6)
        under_load = getattr(self.pace, "busy_units", 0)
        if under_load:  # units a duty cycle let start while serving was busy: timed under load
            out["units_under_load"] = float(under_load)
        heavy = getattr(self.pace, "heavy_under_load", 0)
        if heavy:  # compiles in this process that serving never paused for
            out["heavy_under_load"] = float(heavy)
        return out

    def count(self, name: str, n: float) -> None:
        """Add ``n`` to the count ``name``, kept beside the seconds (``totals``)."""
        self.counts[name] = self.counts.get(name, 0.0) + float(n)

    def add(self, name: str, seconds: float, candidate: Any = None) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        if candidate is not None:
            per = self._by_candidate.setdefault(candidate, {})
            per[name] = per.get(name, 0.0) + seconds


def current() -> Phases | None:
    """The current thread's recording, or None."""
    return getattr(_local, "current", None)


@contextlib.contextmanager
def phase(name: str, candidate: Any = None, heavy: bool = False) -> Iterator[None]:
    """One unit of work of phase ``name`` (on ``candidate``, if it is one candidate's). ``heavy``:
    it may compile in this process (seconds of Python that hold the GIL), so a pacer starts it
    only in a pause of serving, or after a bound (``_pace``). Only the outermost unit is paced
    and counted: a unit inside another belongs to it."""
    rec = getattr(_local, "current", None)
    if rec is None or rec._depth:
        yield
        return
    if rec.pace is not None:
        waited = time.perf_counter()
        try:
            rec.pace.before(heavy=heavy)
        finally:
            rec.paused_s += time.perf_counter() - waited
    rec._depth = 1
    started = time.perf_counter()
    try:
        yield
    finally:
        rec._depth = 0
        rec.add(name, time.perf_counter() - started, candidate)
        if rec.pace is not None:
            rec.pace.after()


def count(name: str, n: float) -> None:
    """Add ``n`` to the count ``name`` of the current recording (nothing outside one)."""
    rec = getattr(_local, "current", None)
    if rec is not None:
        rec.count(name, n)


def clock() -> float:
    """``time.perf_counter()`` less the time the current recording spent paused: the clock a
    tuning's budget is spent by."""
    rec = getattr(_local, "current", None)
    return time.perf_counter() - (rec.paused_s if rec is not None else 0.0)
