"""Every other thread's Python stack sampled until stopped: where a process's wall time goes,
waits included (``bench_first_call.py --sample-landing``). One stack walk per tick, on the GIL:
sampled runs are slower than unsampled ones, so time them apart."""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter

__all__ = ["Sampler", "FIRST_CALL_THREAD"]


def _short(filename: str) -> str:
    for mark in ("site-packages/", "dist-packages/", "/src/", "/lib/python3"):
        if mark in filename:
            return filename.rsplit(mark, 1)[1]
    return "/".join(filename.rsplit("/", 2)[-2:])


def _caller(stack: tuple) -> str:
    """Who in kernelgraft asked for the time a sample shows: the last three kernelgraft frames, then
    the first frame below them (the library entered: Triton's compiler, an import, Inductor, ...)."""
    ours = [n for n, f in enumerate(stack) if f.startswith("kernelgraft/")]
    if not ours:
        return stack[-1] if stack else "?"
    last = ours[-1]
    chain = " > ".join(f.split("/")[-1] for f in stack[last - min(2, last):last + 1] if f.startswith("kernelgraft/"))
    below = stack[last + 1] if last + 1 < len(stack) else "(itself)"
    return f"{chain} | {below}"


FIRST_CALL_THREAD = "first call (main thread)"


def _innermost_ours(stack: tuple) -> str:
    ours = [f for f in stack if f.startswith("kernelgraft/")]
    return ours[-1] if ours else "-"


class Sampler:
    """Every other thread's Python stack every ``interval`` s until ``stop()``: where the wall time
    of the tuning job (and the compile pool's threads) goes, waits included, at a cost of one
    stack walk per tick (cProfile instead slows every Python call of every thread)."""

    def __init__(self, interval: float = 0.01) -> None:
        self.interval, self.samples, self.main, self.ticks = interval, [], threading.get_ident(), 0
        self.started = time.perf_counter()
        self.in_first_call = True  # the main thread is sampled until the first call returns
        self.first_call_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="landing-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            now = time.perf_counter() - self.started
            self.ticks += 1
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me or (ident == self.main and not self.in_first_call):
                    continue
                stack = []
                while frame is not None and len(stack) < 300:
                    stack.append(f"{_short(frame.f_code.co_filename)}:{frame.f_code.co_name}")
                    frame = frame.f_back
                name = FIRST_CALL_THREAD if ident == self.main else names.get(ident, str(ident))
                self.samples.append((now, name, tuple(reversed(stack))))

    def first_call_returned(self) -> None:
        self.in_first_call = False

    def stop(self, top: int = 45) -> dict:
        """Per thread: seconds by function (inclusive, and innermost), by kernelgraft caller and the
        library it entered (``by_caller_s``), and a timeline of what the tuning worker ran (the innermost kernelgraft frame and the innermost frame, each 0.25 s)."""
        self._stop.set()
        self._thread.join()
        span = time.perf_counter() - self.started
        by_thread: dict[str, list] = {}
        for now, name, stack in self.samples:
            by_thread.setdefault(name, []).append((now, stack))
        out: dict = {"span_s": round(span, 3), "interval_s": self.interval, "threads": {}}
        for name, rows in by_thread.items():
            if len(rows) < 5:
                continue
            tick = span / max(1, self.ticks)  # seconds per sample (the interval, plus the walks)
            inclusive, inner, callers = Counter(), Counter(), Counter()
            for _, stack in rows:
                inclusive.update(set(stack))
                inner[stack[-1] if stack else "?"] += 1
                callers[_caller(stack)] += 1
            entry = {"samples": len(rows),
                     "inclusive_s": [(f, round(n * tick, 3)) for f, n in inclusive.most_common(top)],
                     "innermost_s": [(f, round(n * tick, 3)) for f, n in inner.most_common(25)],
                     "by_caller_s": [(f, round(n * tick, 3)) for f, n in callers.most_common(top)]}
            if name == FIRST_CALL_THREAD or name.startswith("kernelgraft-tune"):
                # every sample while the first call runs (what it waited for, and what the job did
                # beside it), then one per 0.25 s
                early = [(round(now, 3), _innermost_ours(stack), stack[-1] if stack else "-")
                         for now, stack in rows if now <= self.first_call_s]
                entry["first_call_timeline"] = early
            if name.startswith("kernelgraft-tune"):
                timeline, bucket = [], None
                for now, stack in rows:
                    b = int(now / 0.25)
                    if b != bucket:
                        bucket = b
                        timeline.append((round(now, 2), _innermost_ours(stack), stack[-1] if stack else "-"))
                entry["timeline"] = timeline
            out["threads"][name] = entry
        return out
