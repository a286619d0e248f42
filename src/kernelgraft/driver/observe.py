"""Launch observation, per thread: what a launch path tells whoever watches the calling thread.

A launch path (the driver launcher, a backend's packed call, a Triton describer) asks ``active()``
(one thread-local attribute read, so unobserved launches pay nothing else) and, when a thread
observes, describes its launch as a ``Record`` and passes it to ``note``. An observer is any
object with ``note(record, why)``; ``observing(observer)`` installs it for the calling thread only,
so launches made meanwhile by other threads are neither seen nor slowed. The native replay's
recorder (kernelgraft.native) is one observer; the driver does not depend on it.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Record", "Observer", "active", "observing", "note", "launch_record", "address_of"]


@dataclass
class Record:
    """One launch: ``kind`` 0 (cuLaunchKernel) or 1 (packed host function); ``pointers`` holds
    (byte offset, address) of each device-pointer parameter."""

    kind: int
    fn: int
    function: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    buffer: bytes
    offsets: tuple[int, ...]
    pointers: list[tuple[int, int]]
    stream: int
    device: int
    tail: tuple[int, ...] = ()
    stream_offset: int = -1
    result: int = 0
    owner: Any = None  # keeps the function, result slot and tail pointers alive for the replay


class Observer(Protocol):
    def note(self, record: Record | None, why: str) -> None:
        """One launch of the observed thread (None: one its path cannot describe, ``why`` says why)."""


class _Local(threading.local):
    observer: Any = None  # a class attribute: a thread that never observed reads None, no setup


_LOCAL = _Local()


def active() -> Any:
    """The calling thread's observer, or None (the launch path's only cost when nobody observes)."""
    return _LOCAL.observer


class observing:
    """``with observing(observer):`` sends the calling thread's launches to ``observer``; nests
    (the previous observer is back on exit) and never affects other threads."""

    def __init__(self, observer: Observer) -> None:
        self.observer = observer

    def __enter__(self) -> Observer:
        self.previous = _LOCAL.observer
        _LOCAL.observer = self.observer
        return self.observer

    def __exit__(self, *exc: Any) -> None:
        _LOCAL.observer = self.previous


def note(record: Record | None, why: str = "") -> None:
    """Tell the calling thread's observer about a launch (None: one that cannot be described)."""
    observer = _LOCAL.observer
    if observer is not None:
        observer.note(record, why)


def address_of(fn: Any) -> int:
    """The address of a ctypes function pointer."""
    return int(ctypes.cast(fn, ctypes.c_void_p).value or 0)


def launch_record(raw: Any, function: int, grid: tuple, block: tuple, smem: int, buffer: Any,
                  values: Sequence[Any], stream: int | None, device: int, owner: Any) -> Record:
    """The Record of one ``cuLaunchKernel`` (``raw``, the ctypes entry point) of ``function`` with
    ``values`` packed by ``buffer`` (a ``kernelgraft.driver`` ParamBuffer)."""
    packed = buffer.pack(values)
    pointers = [(o, int(v or 0)) for o, k, v in zip(buffer.offsets, buffer.kinds, values) if k == "ptr"]
    return Record(kind=0, fn=address_of(raw), function=function, grid=grid, block=block, smem=smem,
                  buffer=packed + bytes(-len(packed) % 8), offsets=buffer.offsets, pointers=pointers,
                  stream=int(stream or 0), device=device, owner=owner)
