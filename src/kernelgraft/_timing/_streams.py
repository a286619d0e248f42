"""Streams of kernelgraft's own, for timing and graph capture, that no other code can be handed.

``torch.cuda.Stream()`` hands out streams from a per-device pool, round-robin over 32 per priority:
a later ``torch.cuda.Stream()`` anywhere in the process (torch.cuda.graph's default capture
stream, a user's side stream) can be the very same CUDA stream. Work queued on it would then
wait behind the other's, and a capture begun on it while the other captures would record one's
launches into the other's graph. The tuner captures and times while other threads serve (off the
caller's path), so its streams are created through the driver instead (non-blocking, outside the
pool) and kept per thread and device; where that cannot be done, a pool stream it is.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

import torch

__all__ = ["private_stream"]

log = logging.getLogger(__name__)
_CU_STREAM_NON_BLOCKING = 1


class _Owner:
    """Lives as long as its thread's locals: the streams are destroyed after it."""


class _Held(threading.local):
    def __init__(self) -> None:
        self.streams: dict[tuple[int, str], Any] = {}
        self.owner = _Owner()


_held = _Held()


def _destroy(handle: int) -> None:
    try:
        from ..driver._cu import call

        call("cuStreamDestroy", handle, what="destroying a private stream")
    except Exception:  # at exit, or the driver gone: nothing to free then
        pass


def private_stream(device: torch.device | int | None = None, purpose: str = "work") -> "torch.cuda.Stream":
    """A non-blocking stream on ``device`` (None: the current one) that only this thread uses for
    ``purpose``; the same one on every call."""
    if device is None:
        index = torch.cuda.current_device()
    elif isinstance(device, int):
        index = device
    else:
        index = device.index if device.index is not None else torch.cuda.current_device()
    found = _held.streams.get((index, purpose))
    if found is not None:
        return found
    try:
        from ..driver._cu import call, device_context

        with device_context(index):
            handle = call("cuStreamCreate", _CU_STREAM_NON_BLOCKING, what="creating a private stream")
        stream = torch.cuda.ExternalStream(int(handle), device=torch.device("cuda", index))
        weakref.finalize(_held.owner, _destroy, handle).atexit = False  # when this thread's locals go
    except Exception as exc:  # no cuda-bindings, or the driver refused: a pool stream serves
        log.debug("private stream not created (%s); using a pool stream", exc)
        stream = torch.cuda.Stream(index)
    _held.streams[(index, purpose)] = stream
    return stream
