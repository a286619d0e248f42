"""Streams of kernelgraft's own, for timing and graph capture, that no other code can be handed.

``torch.cuda.Stream()`` hands out streams from a per-device pool, round-robin over 32 per priority:
a later ``torch.cuda.Stream()`` anywhere in the process (torch.cuda.graph's default capture
stream, a user's side stream) can be the very same CUDA stream. Work queued on it would then
wait behind the other's, and a capture begun on it while the other captures would record one's
launches into the other's graph. The tuner captures and times while other threads serve (off the
caller's path), so its streams are created through the driver instead (non-blocking, outside the
pool, in the device's primary context, the one torch uses) and kept per thread and device; where
that cannot be done, a pool stream it is.
"""

from __future__ import annotations

import ctypes
import functools
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


@functools.cache
def _driver() -> Any:
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
    lib.cuStreamDestroy_v2.argtypes = [ctypes.c_void_p]
    lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.cuCtxGetDevice.argtypes = [ctypes.POINTER(ctypes.c_int)]
    return lib


def _destroy(handle: int) -> None:
    try:
        _driver().cuStreamDestroy_v2(ctypes.c_void_p(handle))
    except Exception:  # the driver gone: nothing to free then
        pass


def _create(index: int) -> int:
    """A non-blocking stream in the current context, which must be ``index``'s primary one."""
    lib = _driver()
    with torch.cuda.device(index):
        torch.cuda.current_stream(index).query()  # a runtime call: its context is current on this thread
        ctx, dev = ctypes.c_void_p(), ctypes.c_int(-1)
        if lib.cuCtxGetCurrent(ctypes.byref(ctx)) != 0 or not ctx.value:
            raise RuntimeError("no current CUDA context")
        if lib.cuCtxGetDevice(ctypes.byref(dev)) != 0 or dev.value != index:
            raise RuntimeError(f"the current context is device {dev.value}'s, not {index}'s")
        handle = ctypes.c_void_p()
        status = lib.cuStreamCreate(ctypes.byref(handle), _CU_STREAM_NON_BLOCKING)
        if status != 0 or not handle.value:
            raise RuntimeError(f"cuStreamCreate returned {status}")
        return int(handle.value)


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
        handle = _create(index)
        stream = torch.cuda.ExternalStream(handle, device=torch.device("cuda", index))
        weakref.finalize(_held.owner, _destroy, handle).atexit = False  # when this thread's locals go
    except Exception as exc:  # no driver library, or it refused: a pool stream serves
        log.debug("private stream not created (%s); using a pool stream", exc)
        stream = torch.cuda.Stream(index)
    _held.streams[(index, purpose)] = stream
    return stream
