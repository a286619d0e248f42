"""Count the Triton kernels a tuning compiles in its own process, for its report.

The compile workers compile a key's Triton candidates ahead (``compile_pool``); a gate that then
finds its kernel in Triton's cache compiles nothing. Where one does compile (a job that failed, a
cache the launch does not read, a kernel no job covered), its seconds land in the gate, on the
tuning's thread and GIL. Triton calls ``knobs.compilation.listener`` for each kernel it compiles
or loads from its cache; ``watch()`` installs, once per process, a listener that counts each one
compiled (not a cache hit) inside ``counted()`` (a kernel candidate's gate) in the current
thread's tuning record (``phases.count``: ``compiled_here``; Inductor's kernels, compiled in
``torch:compile``'s gate, are not counted), and passes every event on to the listener that was
there before.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from .phases import count

__all__ = ["watch", "counted"]

_lock = threading.Lock()
_installed: list[Any] = []  # the listener installed here, once
_local = threading.local()  # .on: this thread is inside counted()


@contextlib.contextmanager
def counted() -> Iterator[None]:
    """Inside, this thread's Triton compiles count in its tuning record (``watch`` installed)."""
    outer = getattr(_local, "on", False)
    _local.on = True
    try:
        yield
    finally:
        _local.on = outer


def watch() -> None:
    """Install the counting listener (idempotent; nothing where Triton has no listener knob). A
    listener set after this replaces it: the counts then stop, nothing else changes."""
    if _installed:
        return
    with _lock:
        if _installed:
            return
        try:
            from triton import knobs
        except ImportError:
            return
        compilation = getattr(knobs, "compilation", None)
        if compilation is None or not hasattr(compilation, "listener"):
            return
        previous = compilation.listener

        def listener(**event: Any) -> None:
            if event.get("cache_hit") is False and getattr(_local, "on", False):
                count("compiled_here", 1)  # a no-op outside a tuning's record
            if previous is not None:
                previous(**event)

        compilation.listener = listener
        _installed.append(listener)
