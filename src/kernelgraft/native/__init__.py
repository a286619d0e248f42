"""The native fast path: a small C++ extension that replays a one-launch plan (see replay.cpp).

Where it lives: ``<kernelgraft cache>/native/<torch>-<python>-<source hash>/`` (a private
``tempfile.mkdtemp`` directory of this process when disk caching is off). A finished build there
is loaded on the calling thread by opening the library directly, after checking that the
directory is this user's alone and that the library hashes to the value recorded when it was
built (_build.py); nothing else is ever loaded, and torch's C++ extension tooling is not imported.

Building takes 10-15 s of CPU: ``kg.native.build()`` or ``kernelgraft doctor --build`` do it ahead
of time. Otherwise the first plan that wants a replay starts the build in a child process and
later calls poll it (one ``waitpid``, no blocking); until it is loaded, and wherever it cannot be
built, eager calls take the Python path (same results, more host time). ``busy()`` is true while a
build or load is in progress, so timing can wait. ``KERNELGRAFT_NATIVE=0`` turns it off;
``load()`` builds if needed and waits (benchmarks, tests); ``reason()`` says why it is unavailable.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType

from . import builder as _build

__all__ = ["get", "load", "build", "busy", "reason", "enabled", "directory"]

log = logging.getLogger(__name__)
_SOURCE = Path(__file__).with_name("replay.cpp")
_LOCK = threading.RLock()
# module: the loaded extension; reason: why there is none (final); child: the build process and
# its log; loading: a load in progress; private: this process's directory when caching is off.
_STATE: dict = {"module": None, "reason": None, "child": None, "loading": False, "private": None}


def enabled() -> bool:
    return os.environ.get("KERNELGRAFT_NATIVE", "1").lower() not in ("0", "off", "false", "no")


def _tag() -> str:
    import torch

    # the link flags too: a build made with other flags is another build
    digest = hashlib.sha256(_SOURCE.read_bytes() + " ".join(_build.LDFLAGS).encode()).hexdigest()[:16]
    tag = f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{digest}"
    return tag.replace("+", "_")


def _private_root() -> Path:
    """This process's own directory (0700, unpredictable name), removed at exit."""
    if _STATE["private"] is None:
        _STATE["private"] = Path(tempfile.mkdtemp(prefix="kernelgraft-native-"))
        atexit.register(_forget_private)
    return _STATE["private"]


def _forget_private() -> None:
    child = _STATE["child"]
    if child is not None and child[0].poll() is None:
        child[0].kill()  # its output would go to a directory about to be removed
        child[0].wait()
    shutil.rmtree(_STATE["private"], ignore_errors=True)


def directory() -> Path:
    """The build directory for this torch, Python and replay source (created private: 0700)."""
    from ..cache.code import cache_root

    root = cache_root()
    base = root / "native" if root is not None else _private_root()
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = base / _tag()
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _checked_directory() -> Path | str:
    """The build directory, or why neither it nor its parent may hold code this process loads."""
    try:
        path = directory()
    except OSError as exc:
        return f"the native replay's directory cannot be created: {exc}"
    why = _build.untrusted(path.parent) or _build.untrusted(path)
    return path if why is None else f"refusing to build or load the native replay: {why}"


def _refuse(why: str) -> None:
    _STATE["reason"] = why
    log.warning("%s; eager calls take the Python path", why)


def _open(library: Path, fd: int | None = None) -> ModuleType:
    """Import the extension; through ``/proc/self/fd/<fd>`` when given (and the platform has it),
    so the loader maps the very file whose bytes were hashed, not whatever the path names now."""
    origin = str(library) if fd is None else _build.fd_path(fd, library)
    loader = importlib.machinery.ExtensionFileLoader(_build.NAME, origin)
    spec = importlib.util.spec_from_file_location(_build.NAME, origin, loader=loader)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    module.__file__ = str(library)
    return module


def _load_built(path: Path) -> ModuleType | None | str:
    """The verified build of ``path`` loaded, None when there is none, or why it is refused."""
    found = _build.open_verified(path)
    if not isinstance(found, tuple):
        return found
    fd, library = found
    _STATE["loading"] = True
    try:
        start = time.perf_counter()
        module = _open(library, fd)
        _build.keep(fd)  # loaded from /proc/self/fd/<fd>: the number must not come back
        log.debug("kernelgraft native replay loaded from %s in %.1f ms", library,
                  1e3 * (time.perf_counter() - start))
        return module
    except Exception as exc:  # a library for another ABI, a missing symbol: the Python path stays
        os.close(fd)
        return f"the native replay at {library} did not load: {type(exc).__name__}: {exc}"
    finally:
        _STATE["loading"] = False


def _start_child(path: Path) -> None:
    """Start the build in a child process writing its output to ``build.log`` (never a pipe: a
    child blocked on a full pipe nobody reads would never finish)."""
    flags = ["-P"] if sys.version_info >= (3, 11) else []  # keep _native/ off the child's path
    log_file = open(path / "build.log", "wb")
    try:
        proc = subprocess.Popen([sys.executable, *flags, _build.__file__, str(path), str(_SOURCE)],
                                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT)
    finally:
        log_file.close()
    _STATE["child"] = (proc, path)
    _STATE["pid"] = os.getpid()
    log.info("building the kernelgraft native replay in a child process (pid %d) into %s", proc.pid, path)


def _child_done(block: bool) -> bool:
    """Whether the build child has finished (then its result is taken: loaded or a reason)."""
    proc, path = _STATE["child"]
    if _STATE.get("pid") != os.getpid():
        # A forked process (a DataLoader worker) inherited its parent's child, which it cannot
        # wait for: look for the parent's finished build instead.
        _STATE["child"] = None
        _take(_load_built(path), after_build=False)
        return True
    if (proc.wait() if block else proc.poll()) is None:
        return False
    _STATE["child"] = None
    if proc.returncode != 0:
        try:
            tail = (path / "build.log").read_text(errors="replace").strip().splitlines()[-1:]
        except OSError:
            tail = []
        _STATE["reason"] = (f"the native replay did not build (exit status {proc.returncode}): "
                            f"{' '.join(tail) or 'no output'}; see {path / 'build.log'}")
        log.info("%s; eager calls take the Python path", _STATE["reason"])
        return True
    _take(_load_built(path), after_build=True)
    return True


def _take(result: ModuleType | None | str, after_build: bool) -> None:
    if isinstance(result, ModuleType):
        _STATE["module"] = result
    elif isinstance(result, str):
        _refuse(result)
    elif after_build:
        _refuse("the native replay's build finished without a build record")


def get() -> ModuleType | None:
    """The loaded extension, or None while it builds (in a child process) or when it cannot.

    Never blocks on a build: a finished build is loaded here (milliseconds), a missing one is
    started in a child process and polled by later calls."""
    module = _STATE["module"]
    if module is not None or _STATE["reason"] is not None or not enabled():
        return module
    if not _LOCK.acquire(blocking=False):
        return None  # another thread is loading, or waiting for the build: the Python path for now
    try:
        if _STATE["module"] is not None or _STATE["reason"] is not None:
            return _STATE["module"]
        if _STATE["child"] is not None:
            _child_done(block=False)
            return _STATE["module"]
        path = _checked_directory()
        if isinstance(path, str):
            _refuse(path)
            return None
        found = _load_built(path)
        if found is None:
            _start_child(path)
        else:
            _take(found, after_build=False)
        return _STATE["module"]
    except Exception as exc:  # a read-only cache, no fork: never an error in the user's op call
        _refuse(f"the native replay's build could not start: {type(exc).__name__}: {exc}")
        return None
    finally:
        _LOCK.release()


def load() -> ModuleType | None:
    """The extension, building it first if needed (in a child process) and waiting; None when it
    cannot be built or loaded (see ``reason``)."""
    get()
    with _LOCK:
        if _STATE["child"] is not None:
            _child_done(block=True)
    return _STATE["module"]


def build() -> Path:
    """Build the extension ahead of time (in a child process; returns at once when a verified
    build exists) and return its library. Raises ``CompileError`` saying why it cannot be built."""
    from ..errors import CompileError

    path = _checked_directory()
    if isinstance(path, str):
        raise CompileError(path)
    with _LOCK:
        if _STATE["child"] is None and not isinstance(_build.verified_library(path), Path):
            _start_child(path)  # asked for: an altered build is replaced, not just refused
        if _STATE["child"] is not None:
            _child_done(block=True)
        library = _build.verified_library(path)
        if isinstance(library, Path):
            if _STATE["module"] is None:
                _STATE["reason"] = None  # a failed on-demand build no longer decides
                _take(_load_built(path), after_build=True)
            return library
    raise CompileError(_STATE["reason"] or (library if isinstance(library, str) else
                       f"the native replay did not build into {path}"))


def busy() -> bool:
    """True while this process builds (a child process it started) or loads the extension: time
    nothing meanwhile (the build competes for the CPU, a load holds the calling thread)."""
    child = _STATE["child"]
    return _STATE["loading"] or (child is not None and child[0].poll() is None)


def reason() -> str | None:
    """Why the native replay is unavailable, or None."""
    if not enabled():
        return "turned off by KERNELGRAFT_NATIVE=0"
    return _STATE["reason"]


def _reset() -> None:
    """Forget the loaded module and any reason (tests); a running build child is waited for."""
    with _LOCK:
        if _STATE["child"] is not None:
            _STATE["child"][0].wait()
        _STATE.update(module=None, reason=None, child=None, loading=False)
