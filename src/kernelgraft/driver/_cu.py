"""Access to the CUDA driver API through cuda-bindings, imported on first use.

Every driver call goes through ``call`` so a failure becomes a ``LaunchError`` that names the call
and the CUDA error, and a machine without a driver says so instead of crashing at import.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from .._errors import LaunchError

__all__ = ["cu", "call", "available", "ensure_context", "capability"]

log = logging.getLogger(__name__)
_LOCK = threading.Lock()


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


def ensure_context(device_index: int) -> None:
    """Make the device's primary context (the one torch uses) current on this thread."""
    ctx = call("cuCtxGetCurrent", what="reading the current context")
    if ctx is not None and int(ctx) != 0:
        return
    with _LOCK:
        dev = call("cuDeviceGet", device_index, what=f"opening device {device_index}")
        primary = call("cuDevicePrimaryCtxRetain", dev, what="retaining the primary context")
        call("cuCtxSetCurrent", primary, what="making the primary context current")
        log.debug("made the primary context of device %d current", device_index)


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
