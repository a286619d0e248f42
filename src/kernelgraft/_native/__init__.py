"""The native fast path: a small C++ extension that replays a one-launch plan (see replay.cpp).

It is built on first use with torch's C++ extension tooling (a C++ compiler and ninja), in a
background thread, into ``<kernelgraft cache>/native/<torch>-<python>-<source hash>``; until it is
ready, and wherever it cannot be built, eager calls take the Python path (same results, more host
time). ``KERNELGRAFT_NATIVE=0`` turns it off; ``load()`` builds and waits (benchmarks, tests,
``kernelgraft doctor``); ``reason()`` says why it is unavailable.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

__all__ = ["get", "load", "reason", "enabled"]

log = logging.getLogger(__name__)
_SOURCE = Path(__file__).with_name("replay.cpp")
_LOCK = threading.Lock()
_STATE: dict = {"module": None, "reason": None, "thread": None}


def enabled() -> bool:
    return os.environ.get("KERNELGRAFT_NATIVE", "1").lower() not in ("0", "off", "false", "no")


def _build_dir() -> Path:
    import torch

    from .._codecache import cache_root

    digest = hashlib.sha256(_SOURCE.read_bytes()).hexdigest()[:16]
    tag = f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{digest}"
    root = cache_root()
    base = root / "native" if root is not None else Path(tempfile.gettempdir()) / "kernelgraft-native"
    path = base / tag.replace("+", "_")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _build() -> None:
    try:
        from torch.utils import cpp_extension

        if not cpp_extension.is_ninja_available():
            raise RuntimeError("ninja is not installed (pip install ninja)")
        module = cpp_extension.load(
            "kernelgraft_native", [str(_SOURCE)], build_directory=str(_build_dir()),
            extra_cflags=["-O2"], verbose=False,
        )
        _STATE["module"] = module
        log.debug("kernelgraft native replay loaded from %s", module.__file__)
    except Exception as exc:  # no compiler, no headers, a failed build: the Python path stays
        _STATE["reason"] = f"the native replay did not build: {type(exc).__name__}: {exc}"
        log.info("%s; eager calls take the Python path", _STATE["reason"])


def get() -> ModuleType | None:
    """The built extension, or None while it builds (in the background) or when it cannot."""
    module = _STATE["module"]
    if module is not None or _STATE["reason"] is not None:
        return module
    if not enabled():
        return None
    with _LOCK:
        if _STATE["thread"] is None:
            _STATE["thread"] = threading.Thread(target=_build, name="kernelgraft-native-build", daemon=True)
            _STATE["thread"].start()
    return None


def load() -> ModuleType | None:
    """Build (or load the cached build) and wait; None when it cannot be built (see ``reason``)."""
    get()
    thread = _STATE["thread"]
    if thread is not None:
        thread.join()
    return _STATE["module"]


def reason() -> str | None:
    """Why the native replay is unavailable, or None."""
    if not enabled():
        return "turned off by KERNELGRAFT_NATIVE=0"
    return _STATE["reason"]
