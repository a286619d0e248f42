"""Limits checked when a call is planned: outputs that could never be allocated, and torch's
ERROR log lines for inputs that are merely wrong.

Both run once per signature (planning), never on the cached-plan path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

import torch

from ..errors import InputError, describe

__all__ = ["check_allocatable", "device_memory", "quiet_fake_tensor_errors"]

_memory: dict[Any, int | None] = {}


def device_memory(device: torch.device) -> int | None:
    """Bytes of memory on ``device`` (physical RAM for the CPU), or None where unknown or
    unbounded (meta tensors)."""
    key = (device.type, device.index)
    if key not in _memory:
        size = None
        try:
            if device.type == "cpu":
                size = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            elif device.type == "cuda":
                index = device.index if device.index is not None else torch.cuda.current_device()
                size = torch.cuda.get_device_properties(index).total_memory
        except (ValueError, OSError, RuntimeError, AttributeError):
            size = None
        _memory[key] = size
    return _memory[key]


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover


def check_allocatable(op_name: str, what: str, shape: tuple[int, ...], dtype: torch.dtype,
                      device: torch.device, args: tuple) -> None:
    """InputError when one output needs more bytes than the device has: such a call (inputs
    expanded to a huge shape, a size computed wrong) is refused before anything is allocated,
    instead of an allocator error from deep inside torch or a machine driven into swap."""
    limit = device_memory(device)
    if limit is None:
        return
    numel = 1
    for s in shape:
        numel *= s
    need = numel * dtype.itemsize
    if need > limit:
        inputs = ", ".join(describe(a) for a in args if isinstance(a, torch.Tensor))
        raise InputError(
            f"{op_name}: {what} would be shape {shape} of {dtype}, {_size(need)}, more than the "
            f"{_size(limit)} of memory on {device}; the inputs ({inputs}) ask for an output that "
            "cannot be allocated"
        )


_quiet = threading.local()


class _DropWhileQuiet(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_quiet, "on", False)


_FAKE_LOG = logging.getLogger("torch._subclasses.fake_tensor")
_FAKE_LOG.addFilter(_DropWhileQuiet())


@contextlib.contextmanager
def quiet_fake_tensor_errors() -> Iterator[None]:
    """Drop, in this thread, the ERROR traceback torch's FakeTensorMode logs before re-raising a
    failed shape computation: kernelgraft turns the exception itself into an InputError, and bad
    input must not print a traceback at ERROR level."""
    before = getattr(_quiet, "on", False)
    _quiet.on = True
    try:
        yield
    finally:
        _quiet.on = before
