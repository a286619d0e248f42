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
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

__all__ = ["get", "load", "reason", "enabled"]

log = logging.getLogger(__name__)
_SOURCE = Path(__file__).with_name("replay.cpp")
_NAME = "kernelgraft_native"
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


def _compile(directory: Path) -> ModuleType:
    """Build in a fresh directory of this process and move the library into place atomically.

    torch's own build lock (a lock file) is never cleared when a process dies mid-build, and a
    process may well exit while this runs in the background, so each build gets its own directory
    and ``filelock`` (an OS lock, released with the process) keeps two builds from racing.
    """
    import importlib.util

    from filelock import FileLock
    from torch.utils import cpp_extension

    final = directory / f"{_NAME}.so"
    with FileLock(str(directory / "build.lock")):
        for stale in directory.glob("build-*"):  # left by a process that died building
            shutil.rmtree(stale, ignore_errors=True)
        if not final.exists():
            if not cpp_extension.is_ninja_available():
                raise RuntimeError("ninja is not installed (pip install ninja)")
            work = Path(tempfile.mkdtemp(prefix="build-", dir=directory))
            try:
                cpp_extension.load(_NAME, [str(_SOURCE)], build_directory=str(work),
                                   extra_cflags=["-O2"], verbose=False)
                os.replace(work / f"{_NAME}.so", final)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    spec = importlib.util.spec_from_file_location(_NAME, final)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _build() -> None:
    try:
        module = _compile(_build_dir())
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
