"""When a background tuning's next unit of work may start: quiet windows, else a duty cycle.

The process is *busy* when its other threads used more than ``BUSY_CPU`` of a core (the tuning
workers' own threads left out) over a short probe (``PROBE_S``, the worker asleep meanwhile), or
the device's default stream has work queued. A look back over the unit just run can say *quiet*
without the probe (``Watch``), so back-to-back units leave the GPU no gap. Nothing is read on the
op's hot path: the calls being served pay nothing for being watched.

A unit starts at once when the process is quiet. While it is busy, units start at a duty cycle: a
token bucket fills at ``duty`` seconds per second (at most ``BURST_S``), a unit may start once it
holds ``BURST_S / 2``, and every unit started while busy drains it by the unit's length. So under
serving that never pauses the tuning takes at most ``duty`` of the wall time (and of the GIL and
the GPU) plus the one unit in flight, and it still lands; when serving pauses it runs at full
speed. ``KERNELGRAFT_TUNE_DUTY`` sets the share (default 0.05; 1: light units never wait).

The unit in flight is not interrupted, and a duty cycle cannot bound what one unit does while it
runs. Torch releases the GIL inside its ops, but a unit that compiles in this process (a first
launch's JIT compile in the gate, ``torch:compile``'s Inductor compile of the reference) runs
Python for seconds: the serving threads then get the GIL back only every
``sys.getswitchinterval()`` and nearly stop. Such a unit is *heavy* (``before(heavy=True)``):
while serving is busy it does not start on the duty cycle but waits for a quiet window, for at
most ``heavy_wait()`` seconds (``KERNELGRAFT_TUNE_HEAVY_WAIT``, default ``HEAVY_WAIT_S`` = 10;
0 paces heavy units as light ones), and only then starts on the duty cycle anyway, so a tuning
still lands on a machine that never goes quiet; those are counted (``heavy_under_load``). What
serving can expect, then: light units take at most ``duty`` of its time plus one unit in flight;
heavy units start only in a pause of serving (and slow it only if it resumes while they run) or
after it stayed busy for ``heavy_wait()`` seconds. Compiles run ahead in the worker pool (at a
lower CPU priority) hold none of this process's GIL and are not heavy.

>>> p = Pacer(lambda: False)
>>> p.before(); p.after(); p.before(heavy=True); p.after(); p.busy_units
0
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

__all__ = ["Pacer", "Watch", "Cancelled", "duty", "heavy_wait", "PROBE_S", "BUSY_CPU", "HEAVY_WAIT_S"]

log = logging.getLogger(__name__)

PROBE_S = 0.002  # how long the process is watched before a unit
BUSY_CPU = 0.25  # other threads using more of a core than this: busy
BURST_S = 0.05  # the most work a busy stretch may bank
MAX_SLEEP_S = 0.25  # a waiting worker looks again (and at cancellation) at least this often
MIN_SLEEP_S = 0.001  # and at most this often (a refill that rounds just short must still wait)
HEAVY_WAIT_S = 10.0  # how long a heavy unit waits for a quiet window while serving stays busy
HEAVY_POLL_S = 0.05  # how often a waiting heavy unit looks for one (each look is a short probe)

# The tuning workers' threads (kernel thread ids): their CPU time is the tuning's, not serving's.
_workers: set[int] = set()
_workers_lock = threading.Lock()


class Cancelled(BaseException):
    """The tuning was dropped (its op replaced or unregistered, decisions cleared, the process
    exiting). A BaseException: it must pass through the trials, which exclude a candidate on any
    Exception."""


def duty() -> float:
    """``KERNELGRAFT_TUNE_DUTY`` in (0, 1], else the default 0.05."""
    try:
        value = float(os.environ.get("KERNELGRAFT_TUNE_DUTY", "") or 0.05)
    except ValueError:
        return 0.05
    return value if 0.0 < value <= 1.0 else 0.05


def heavy_wait() -> float:
    """``KERNELGRAFT_TUNE_HEAVY_WAIT`` in seconds (>= 0; 0: heavy units are paced as light ones),
    else the default ``HEAVY_WAIT_S``."""
    try:
        value = float(os.environ.get("KERNELGRAFT_TUNE_HEAVY_WAIT", "") or HEAVY_WAIT_S)
    except ValueError:
        return HEAVY_WAIT_S
    return value if 0.0 <= value < float("inf") else HEAVY_WAIT_S


def register_worker(tid: int) -> None:
    """Count thread ``tid`` (``threading.get_native_id()``) as the tuning's own."""
    with _workers_lock:
        _workers.add(tid)


def unregister_worker(tid: int) -> None:
    with _workers_lock:
        _workers.discard(tid)


def _workers_cpu() -> float:
    """CPU seconds of the worker threads. Each thread's clock is named by its kernel thread id
    (Linux's ``MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)``), never by a pthread handle, which is
    undefined once the thread has ended; an ended thread's clock is EINVAL, skipped."""
    total = 0.0
    with _workers_lock:
        tids = list(_workers)
    for tid in tids:
        try:
            total += time.clock_gettime(((~tid) << 3) | 6)
        except (OSError, AttributeError, OverflowError):  # ended, or no such clocks on this system
            continue
    return total


class Watch:
    """Other threads' CPU use, looked at between units of work.

    ``since()`` covers the time since the last look (the unit just run, mostly) and needs no sleep,
    so back-to-back units leave the GPU no gap; but what the worker's own work set going on other
    threads (torch's intra-op pool, a compiler's threads) counts there too. So it only ever says
    *quiet*; when it says busy, ``probe()`` decides: a short sleep with the worker idle."""

    MAX_WINDOW_S = 0.5  # older activity says little about now

    def __init__(self) -> None:
        self._mark()

    def _mark(self) -> None:
        self._t, self._p, self._w = time.perf_counter(), time.process_time(), _workers_cpu()

    def _rate(self) -> float:
        t, p, w = time.perf_counter(), time.process_time(), _workers_cpu()
        rate = max(0.0, (p - self._p) - (w - self._w)) / max(t - self._t, 1e-6)
        self._t, self._p, self._w = t, p, w
        return rate

    def since(self, window_s: float = PROBE_S, sleep: Callable[[float], None] = time.sleep) -> float:
        """Other threads' cores of CPU since the last look (at least ``window_s`` of it)."""
        if time.perf_counter() - self._t > self.MAX_WINDOW_S:
            self._mark()
        wait = window_s - (time.perf_counter() - self._t)
        if wait > 0:
            sleep(wait)
        return self._rate()

    def probe(self, window_s: float = PROBE_S, sleep: Callable[[float], None] = time.sleep) -> float:
        """Other threads' cores of CPU over ``window_s`` from now, the caller asleep."""
        self._mark()
        sleep(window_s)
        return self._rate()

    def busy(self, threshold: float = BUSY_CPU) -> bool:
        return self.since() > threshold and self.probe() > threshold


class Pacer:
    """Paces one tuning's units (``_phases.Pace``): ``busy()`` says whether serving is active
    (it may take a moment: the probe), ``cancelled()`` whether to stop (raises ``Cancelled``).
    ``heavy_s``: how long a heavy unit waits for a quiet window (default ``heavy_wait()``)."""

    def __init__(self, busy: Callable[[], bool], *, share: float | None = None, heavy_s: float | None = None,
                 cancelled: Callable[[], bool] = lambda: False,
                 sleep: Callable[[float], None] = time.sleep, now: Callable[[], float] = time.monotonic) -> None:
        self.busy, self.cancelled = busy, cancelled
        self.share = duty() if share is None else share
        self.heavy_s = heavy_wait() if heavy_s is None else heavy_s
        self._sleep, self._now = sleep, now
        self.tokens = 0.0
        self._updated = now()
        self._unit: float | None = None  # when the unit under way started, if it started busy
        self.busy_units = 0  # units started while serving was busy (timed under load)
        self.heavy_under_load = 0  # of those, heavy units that waited out ``heavy_s`` first

    def _refill(self) -> None:
        now = self._now()
        self.tokens = min(BURST_S, self.tokens + (now - self._updated) * self.share)
        self._updated = now

    def before(self, heavy: bool = False) -> None:
        """Wait until the next unit may start (``heavy``: it compiles in this process, see the
        module docstring); raises ``Cancelled`` when the tuning was dropped meanwhile."""
        waiting_since: float | None = None  # a heavy unit's first look at a busy process
        while True:
            if self.cancelled():
                raise Cancelled()
            busy = self.busy()
            self._refill()
            if not busy:
                self._unit = None
                return
            if heavy and self.heavy_s > 0:
                now = self._now()
                if waiting_since is None:
                    waiting_since = now
                left = self.heavy_s - (now - waiting_since)
                if left > 0:  # a quiet window may yet come: look again soon
                    self._sleep(max(MIN_SLEEP_S, min(HEAVY_POLL_S, left)))
                    continue
            if self.share >= 1.0 or self.tokens >= BURST_S / 2:
                self.busy_units += 1
                if heavy:
                    self.heavy_under_load += 1
                self._unit = self._now()
                return
            self._sleep(min(MAX_SLEEP_S, max(MIN_SLEEP_S, (BURST_S / 2 - self.tokens) / self.share)))

    def after(self) -> None:
        if self._unit is not None:
            self._refill()
            self.tokens -= self._now() - self._unit
            self._unit = None
