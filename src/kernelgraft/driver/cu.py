"""Access to the CUDA driver API through cuda-bindings, imported on first use.

Every driver call goes through ``call`` so a failure becomes a ``LaunchError`` that names the call
and the CUDA error, and a machine without a driver says so instead of crashing at import.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Iterator
from typing import Any

from ..errors import LaunchError

__all__ = [
    "cu", "call", "available", "ensure_context", "device_context", "context_device", "primary_context",
    "capability",
]

log = logging.getLogger(__name__)
_LOCK = threading.Lock()
_PRIMARY: dict[int, Any] = {}  # device index -> its retained primary context (retained once)


@functools.cache
def cu() -> Any:
    """The ``cuda.bindings.driver`` module, after ``cuInit``."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise LaunchError(
            "the CUDA driver layer needs cuda-bindings (pip install 'kernelgraft[cuda]' or "
            f"pip install cuda-bindings): {exc}"
        ) from exc
    try:
        (err,) = driver.cuInit(0)
    except Exception as exc:  # no libcuda on this machine (DynamicLibNotFoundError, OSError)
        raise LaunchError(f"the CUDA driver is not available on this machine: {exc}") from exc
    if int(err) != 0:
        raise LaunchError(f"cuInit failed: {_name(driver, err)}")
    return driver


def available() -> str | None:
    """None when the driver can be used here, else why not."""
    try:
        cu()
    except LaunchError as exc:
        return str(exc)
    return None


def _name(driver: Any, err: Any) -> str:
    try:
        _, text = driver.cuGetErrorString(err)
        detail = text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # pragma: no cover - the error string itself is best effort
        detail = ""
    return f"{getattr(err, 'name', err)} ({detail})" if detail else str(getattr(err, "name", err))


def call(fn_name: str, *args: Any, what: str = "") -> Any:
    """``cuda.bindings.driver.<fn_name>(*args)``, raising ``LaunchError`` on failure.

    Returns the call's results without the error code (a single value, a tuple, or None).
    """
    driver = cu()
    result = getattr(driver, fn_name)(*args)
    err, rest = result[0], result[1:]
    if int(err) != 0:
        suffix = f" while {what}" if what else ""
        raise LaunchError(f"{fn_name} failed{suffix}: {_name(driver, err)}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def primary_context(device_index: int) -> Any:
    """The device's primary context (the one torch and the CUDA runtime use), retained once."""
    ctx = _PRIMARY.get(device_index)
    if ctx is None:
        with _LOCK:
            ctx = _PRIMARY.get(device_index)
            if ctx is None:
                dev = call("cuDeviceGet", device_index, what=f"opening device {device_index}")
                ctx = call("cuDevicePrimaryCtxRetain", dev,
                           what=f"retaining the primary context of device {device_index}")
                _PRIMARY[device_index] = ctx
    return ctx


def context_device() -> int | None:
    """The device of this thread's current context, or None when no context is current."""
    ctx = call("cuCtxGetCurrent", what="reading the current context")
    if ctx is None or int(ctx) == 0:
        return None
    return int(call("cuCtxGetDevice", what="reading the current context's device"))


def ensure_context(device_index: int) -> None:
    """Make the device's primary context current on this thread, unless a context of that device
    already is. A context of another device (the current device is 0, the tensors are on 1) is
    replaced: this changes the thread's current device, so code that must leave it as it was uses
    ``device_context`` instead."""
    if context_device() == device_index:
        return
    call("cuCtxSetCurrent", primary_context(device_index),
         what=f"making the primary context of device {device_index} current")
    log.debug("made the primary context of device %d current", device_index)


@contextlib.contextmanager
def device_context(device_index: int) -> Iterator[None]:
    """The device's primary context current inside the block, the thread's previous one (or none)
    current again after it. Loading a module, finding a kernel and setting its attributes happen
    in the context of the device they are for, whatever device the caller has current."""
    if context_device() == device_index:
        yield
        return
    call("cuCtxPushCurrent", primary_context(device_index),
         what=f"pushing the primary context of device {device_index}")
    try:
        yield
    finally:
        call("cuCtxPopCurrent", what=f"popping the primary context of device {device_index}")


@functools.cache
def capability(device_index: int) -> tuple[int, int]:
    driver = cu()
    dev = call("cuDeviceGet", device_index)
    attr = driver.CUdevice_attribute
    major = call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    minor = call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    return int(major), int(minor)


@functools.cache
def raw_launch() -> Any:
    """``cuLaunchKernel`` from libcuda through ctypes, or None where it cannot be loaded.

    cuda-bindings wraps every argument in Python objects on each call (several microseconds);
    the ctypes entry point takes plain integers, which is what the hot path has. Both call the
    same driver function in the same (primary) context.
    """
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuLaunchKernel
    except (OSError, AttributeError):
        return None
    u = ctypes.c_uint
    fn.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn
